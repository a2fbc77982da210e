"""`fsprobe.save` as a drop-in for `torch.save`: file objects pass through, and without torch
(or Lightning) the error names the extra to install."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fsprobe


def model_state() -> dict:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return {"model": model.state_dict(), "epoch": 3}


def test_a_bytes_buffer_gets_exactly_what_torch_save_writes():
    obj = model_state()
    expected = io.BytesIO()
    torch.save(obj, expected)
    buffer = io.BytesIO()
    result = fsprobe.save(obj, buffer)
    assert buffer.getvalue() == expected.getvalue()
    assert result.bytes == len(expected.getvalue()) and not result.redirected
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    for key, value in obj["model"].items():
        assert torch.equal(loaded["model"][key], value)


def test_an_open_file_is_written_through_as_it_is(tmp_path):
    obj = model_state()
    expected = io.BytesIO()
    torch.save(obj, expected, pickle_protocol=4)
    with open(tmp_path / "model.pt", "wb") as stream:
        stream.write(b"header")  # the caller's file, the caller's position
        result = fsprobe.save(obj, stream, pickle_protocol=4)
    assert (tmp_path / "model.pt").read_bytes() == b"header" + expected.getvalue()
    assert result.path == str(tmp_path / "model.pt") and result.bytes == len(expected.getvalue())
    assert os.listdir(tmp_path) == ["model.pt"]  # no temp file, no preflight probe file


def test_something_that_is_neither_a_path_nor_writable_is_refused_by_torch():
    with pytest.raises((AttributeError, TypeError), match="write"):
        fsprobe.save({"x": 1}, 42)


HIDE = """
import sys

class Hidden:
    '''As if these packages were not installed.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "lightning", "lightning_fabric"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hidden())
"""


def without_torch(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HIDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )


def test_without_torch_save_names_the_extra_and_the_rest_works(tmp_path):
    done = without_torch(
        """
        import fsprobe
        from fsprobe.extras import MissingExtra
        report = fsprobe.check(".", fsprobe.ProbeSettings(write_probe=False))  # no torch needed
        print(report.status.label)
        fsprobe.atomic_write("plain.bin", lambda f: f.write(b"x"))
        try:
            fsprobe.save({"w": 1}, "model.pt")
        except MissingExtra as error:
            assert isinstance(error, ModuleNotFoundError) and error.name == "torch"
            print(error)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    status, message = done.stdout.splitlines()
    assert status in ("ok", "degraded")
    assert message == (
        "fsprobe.save needs torch, which is not installed: "
        "pip install '<fsprobe checkout or wheel>[torch]' (fsprobe is not on PyPI)"
    )
    assert sorted(os.listdir(tmp_path)) == ["plain.bin"]  # nothing half-written for the model


def test_without_torch_the_lightning_integration_names_its_extra(tmp_path):
    done = without_torch("import fsprobe.integrations.lightning", tmp_path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "fsprobe.extras.MissingExtra: fsprobe.integrations.lightning needs torch, which is not "
        "installed: pip install '<fsprobe checkout or wheel>[lightning]' (fsprobe is not on PyPI)"
    )


@pytest.mark.parametrize(
    ("module", "needed_by", "extra"),
    [
        ("fsprobe.distributed", "fsprobe.distributed", "torch"),
        ("fsprobe.integrations.dcp", "fsprobe.integrations.dcp", "torch"),
        ("fsprobe.integrations.transformers", "fsprobe.integrations.transformers", "transformers"),
    ],
)
def test_without_torch_each_integration_names_its_extra(module, needed_by, extra, tmp_path):
    done = without_torch(f"import {module}", tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"fsprobe.extras.MissingExtra: {needed_by} needs torch, which is not installed: "
        f"pip install '<fsprobe checkout or wheel>[{extra}]' (fsprobe is not on PyPI)"
    )
