"""The MDTs of a directory from ``lfs getdirstripe DIR``, as the fake `lfs` prints it from
`lmv_dump_user_lmm` (lustre/utils/liblustreapi.c, v2_17_0, lines 2986-3184)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.dirstripe import parse_dirstripe
from fsprobe.lustre.runner import LfsRun
from tests.support.fakes.fake_lfs import FAKE_LFS

NOW = 1_800_000_000.0


def fake_getdirstripe(tmp_path, dirstripe: dict) -> LfsRun:
    (tmp_path / "state.json").write_text(json.dumps({"dirstripe": dirstripe}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))}
    env["FAKE_LFS_STATE"] = str(tmp_path / "state.json")
    argv = ("lfs", "getdirstripe", str(tmp_path))
    done = subprocess.run(
        [sys.executable, str(FAKE_LFS), *argv[1:]], capture_output=True, text=True, env=env,
        timeout=30,
    )  # fmt: skip
    return LfsRun(argv, done.stdout, done.stderr, done.returncode, NOW, 0.01)


@pytest.mark.parametrize(
    ("dirstripe", "mdts", "first_line"),
    [
        ({"offset": 2}, {2}, "lmv_stripe_count: 0 lmv_stripe_offset: 2 lmv_hash_type: none"),
        (
            {"stripes": [1, 3]},
            {1, 3},
            "lmv_stripe_count: 2 lmv_stripe_offset: 1 lmv_hash_type: crush",
        ),
    ],
)
def test_a_plain_and_a_striped_directory_name_their_mdts(tmp_path, dirstripe, mdts, first_line):
    run = fake_getdirstripe(tmp_path, dirstripe)
    assert run.stdout.splitlines()[0] == first_line
    assert parse_dirstripe(run) == frozenset(mdts)


@pytest.mark.parametrize(
    ("stdout", "status", "error"),
    [
        ("lmv_stripe_count: 2 lmv_stripe_offset: 1 lmv_hash_type: crush\n", 0, "PARSE"),
        ("what lfs never prints\n", 0, "PARSE"),
        (
            "lmv_stripe_count: 0 lmv_stripe_offset: 0 lmv_hash_type: none\nsomething else\n",
            0,
            "PARSE",
        ),
        ("", 2, "ENOENT"),
    ],
)
def test_what_getdirstripe_never_prints_is_refused(stdout, status, error):
    run = LfsRun(("lfs", "getdirstripe", "/x"), stdout, "", status, NOW, 0.01)
    with pytest.raises(ProbeFailure) as failure:
        parse_dirstripe(run)
    assert failure.value.error == error
