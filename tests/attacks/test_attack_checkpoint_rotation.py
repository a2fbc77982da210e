"""A neighbour in a shared fallback against a trainer's checkpoint rotation and resume.

Accelerate's `total_limit` under `protect` counts the checkpoints at the target and those
redirected to the fallbacks together, and deletes the oldest from both; `load_state()` resumes
from the newest wherever it landed. A team member who may write the shared fallback can record
copies of her own there under any requested path, the trainer's included.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import ProjectConfiguration  # noqa: E402

from fsprobe.integrations.accelerate import protect  # noqa: E402
from tests.integrations.test_integration_accelerate import same_weights, train  # noqa: E402
from tests.redirect.test_trust_fallback import make_dir  # noqa: E402
from tests.support.users import share  # noqa: E402

pytestmark = pytest.mark.slow  # a framework: the full run only

#: As the user running it: a directory checkpoint saved at argv[1] (redirected to argv[2] when
#: argv[1]'s directory is not hers to write), files that Accelerate's load would take.
PLANT = """
import json, os, sys, fsprobe
def write(staging):
    for name in ("model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl"):
        with open(os.path.join(staging, name), "wb") as stream:
            stream.write(b"mallory's")
result = fsprobe.save_dir(sys.argv[1], write, fallback_dirs=[sys.argv[2]], attempts=2)
print(json.dumps({"path": result.path, "redirected": result.redirected}))
"""


def test_a_neighbours_copies_in_a_shared_fallback_are_neither_counted_nor_loaded(
    local_users, tmp_path
):
    """Root's run saved checkpoints 0 and 1 (total_limit 2); Mallory, in the shared sticky
    fallback, recorded checkpoints 8 and 9 of root's run in her own area. Counted, they would
    have made root's rotation delete both of its real checkpoints and leave hers as the newest
    to resume from. Root resumes from its own checkpoint 1, keeps 1 and 2, and leaves her
    copies where they are: root deletes nothing of hers."""
    share(tmp_path)
    mallory = local_users.user()
    project, plain = make_dir(tmp_path / "run", 0o755), tmp_path / "plain"
    shared = make_dir(tmp_path / "shared", 0o1777)
    train(project, epochs=2, fallbacks=[shared])
    checkpoints = project / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_0", "checkpoint_1"]

    planted = []
    for number in (8, 9):
        done = mallory.python(PLANT, str(checkpoints / f"checkpoint_{number}"), str(shared))
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["redirected"], result
        planted.append(Path(result["path"]))
    assert all(Path(path).stat().st_uid == mallory.uid for path in planted)

    _, resumed, done = train(project, epochs=3, fallbacks=[shared], resume=True)
    _, unfaulted, _ = train(plain, epochs=3)
    assert done.done == 3 and same_weights(resumed, unfaulted)
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_1", "checkpoint_2"]
    for path in planted:
        assert (path / "model.safetensors").read_bytes() == b"mallory's"


def test_roots_rotation_removes_nothing_another_user_wrote(local_users, tmp_path):
    """Root's run keeps one checkpoint (total_limit 1) in a team's project directory, which
    every member may write (2770). Mallory put a symlink `checkpoints` to Bob's directory of
    checkpoints there: root's rotation listed Bob's `checkpoint_0` as its own oldest and
    `shutil.rmtree` removed it, Bob's files with it. A checkpoint goes as every tree fsprobe
    removes: only what is the remover's own."""
    share(tmp_path)
    team = local_users.group()
    mallory, bob = local_users.user(team), local_users.user()
    project = make_dir(tmp_path / "project", 0o2770, group=team)
    bobs = make_dir(tmp_path / "bob", 0o755, owner=bob)
    bob.run(os.mkdir, str(bobs / "checkpoint_0"))
    bob.run((bobs / "checkpoint_0" / "model.safetensors").write_bytes, b"bob's")
    mallory.run(os.symlink, str(bobs), str(project / "checkpoints"))

    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=1, iteration=3
    )
    accelerator = protect(Accelerator(cpu=True, project_config=config), fallback_dirs=[])
    accelerator.prepare(torch.nn.Linear(2, 1))
    accelerator.save_state()
    assert (bobs / "checkpoint_0" / "model.safetensors").read_bytes() == b"bob's"
