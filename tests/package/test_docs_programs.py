"""The documentation's training examples run as written, and do what the pages say they do.

docs/saving.md and docs/integrations.md show one whole program per use (plain PyTorch, DDP with
DCP under torchrun, the Hugging Face Trainer, Accelerate, Lightning). A reader copies them; an API
change that breaks one must fail here, not in a user's first job. Each program is taken from its
page verbatim, run in an empty directory of its own in a fresh interpreter, and its checkpoints
are then opened and checked; each is run a second time where the page says it resumes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

REPO = Path(__file__).resolve().parents[2]
#: The heading of each use, the page it is on, and the first line of the whole program under it.
PROGRAMS = {
    "## Plain PyTorch": ("docs/saving.md", "import os"),
    "## DDP and FSDP: PyTorch Distributed Checkpoint": (
        "docs/integrations.md",
        "# torchrun --nproc-per-node 2 train.py",
    ),
    "## Hugging Face Trainer": ("docs/integrations.md", "import torch"),
    "## Accelerate": ("docs/integrations.md", "import torch"),
    "## Lightning": ("docs/integrations.md", "import torch"),
}


def documented_programs() -> dict[str, str]:
    """The first ```python block under each heading of `PROGRAMS`, as its page has it."""
    programs = {}
    for heading, (page, _first_line) in PROGRAMS.items():
        text = (REPO / page).read_text()
        start = text.index(f"\n{heading}\n")
        block = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
        assert block is not None, f"no python example under {heading!r} in {page}"
        programs[heading] = block.group(1)
    return programs


def run(command: list[str], where: Path) -> None:
    """Run an example in `where`, as a user would, with nothing of the test's environment that
    could change where checkpoints go."""
    environment = {
        key: value for key, value in os.environ.items() if key != "FSPROBE_FALLBACK_DIRS"
    }
    environment |= {"GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(where)}
    done = subprocess.run(
        command, cwd=where, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture
def program(request, tmp_path) -> Path:
    """The documented program for the heading `request.param`, written to ``train.py``."""
    source = documented_programs()[request.param]
    assert source.startswith(PROGRAMS[request.param][1])
    path = tmp_path / "train.py"
    path.write_text(source)
    return path


def nothing_half_written(where: Path) -> list[str]:
    return [str(p.relative_to(where)) for p in where.rglob(".fsprobe~*")]


@pytest.mark.parametrize("program", ["## Plain PyTorch"], indirect=True)
def test_plain_pytorch_saves_in_the_background_and_the_second_run_resumes(program):
    """ "Run it twice: the second run goes on from step 300"."""
    where = program.parent
    run([sys.executable, "train.py"], where)
    assert torch.load(where / "checkpoints/last.pt")["step"] == 300
    run([sys.executable, "train.py"], where)
    state = torch.load(where / "checkpoints/last.pt")
    assert state["step"] == 600
    assert set(state) == {"model", "optim", "step"}
    assert nothing_half_written(where) == []


@pytest.mark.parametrize(
    "program", ["## DDP and FSDP: PyTorch Distributed Checkpoint"], indirect=True
)
def test_dcp_under_torchrun_commits_one_whole_checkpoint(program):
    where = program.parent
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run([*torchrun, "--nproc-per-node", "2", "train.py"], where)
    checkpoint = where / "checkpoints/step-100"
    files = sorted(os.listdir(checkpoint))
    assert ".metadata" in files and len([f for f in files if f.endswith(".distcp")]) == 2
    assert os.listdir(where / "checkpoints") == ["step-100"]
    assert nothing_half_written(where) == []


@pytest.mark.parametrize("program", ["## Hugging Face Trainer"], indirect=True)
def test_hugging_face_trainer_keeps_its_last_two_checkpoints_whole_and_resumes(program):
    where = program.parent
    run([sys.executable, "train.py"], where)
    checkpoints = where / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint-30", "checkpoint-40"]  # limit 2
    for name in ("checkpoint-30", "checkpoint-40"):
        files = set(os.listdir(checkpoints / name))
        assert {"trainer_state.json", "model.safetensors", "optimizer.pt"} <= files
    run([sys.executable, "train.py"], where)  # resumes from checkpoint-40: nothing left to do
    assert sorted(os.listdir(checkpoints)) == ["checkpoint-30", "checkpoint-40"]
    assert nothing_half_written(where) == []


@pytest.mark.parametrize("program", ["## Accelerate"], indirect=True)
def test_accelerate_keeps_its_last_two_checkpoints_whole_and_resumes(program):
    where = program.parent
    run([sys.executable, "train.py"], where)
    checkpoints = where / "run/checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_3", "checkpoint_4"]  # limit 2
    for name in ("checkpoint_3", "checkpoint_4"):
        files = set(os.listdir(checkpoints / name))
        assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= files
    before = (checkpoints / "checkpoint_4/model.safetensors").read_bytes()
    run([sys.executable, "train.py"], where)  # resumes after checkpoint_4: nothing left to do
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_3", "checkpoint_4"]
    assert (checkpoints / "checkpoint_4/model.safetensors").read_bytes() == before
    assert nothing_half_written(where) == []


@pytest.mark.parametrize("program", ["## Lightning"], indirect=True)
def test_lightning_saves_through_the_plugin_and_resumes_from_last(program):
    where = program.parent
    run([sys.executable, "train.py"], where)
    last = torch.load(where / "checkpoints/last.ckpt", weights_only=False)
    assert (last["epoch"], last["global_step"]) == (2, 24)  # 3 epochs of 8 batches
    run([sys.executable, "train.py"], where)  # resumes at the end: trains no further
    assert torch.load(where / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 24
    assert nothing_half_written(where) == []
