"""Lightning strategies that save directories (`FsprobeModelParallelStrategy`, FSDP2 on CPU,
gloo): real `torchrun` jobs of 2 ranks on the fault filesystem and on a tmpfs too small for a
checkpoint. A rank's failed shard write, a redirect of the whole checkpoint, a resume that finds
it, top-k removal of a redirected copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("lightning")

from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

from fsprobe.integrations.lightning_strategies import (  # noqa: E402
    FsprobeFSDPStrategy,
    FsprobeModelParallelStrategy,
)
from fsprobe.redirect.manifest import pending  # noqa: E402
from tests.support.lightning_job import RESULT  # noqa: E402
from tests.support.torchrun import torchrun_job  # noqa: E402

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

#: What Lightning's ModelParallelStrategy writes: every rank's shard, DCP's index, Lightning's.
CHECKPOINT_FILES = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]


def job(output: Path, epochs: int, resume: str | None = None, **environment: str) -> list[dict]:
    """Run tests.support.lightning_job under torchrun; each rank's report, by rank."""
    args = [str(output), str(epochs), *([resume] if resume else [])]
    return torchrun_job("tests.support.lightning_job", RESULT, *args, environment=environment)


def weight_sum(checkpoint: Path, scratch: Path) -> float:
    """The layer's weight as the checkpoint holds it, read back without any rank."""
    consolidated = scratch / "consolidated.pt"
    dcp_to_torch_save(checkpoint, consolidated)
    return float(torch.load(consolidated, weights_only=False)["state_dict"]["layer.weight"].sum())


def test_a_failed_shard_write_on_rank_1_is_retried_and_the_checkpoint_resumes(faultfs, tmp_path):
    output = faultfs.mountpoint / "run"
    rule = faultfs.ctl.fail(
        "write", "EIO", path="/run/.fsprobe~*epoch=1-step=8.ckpt.tmp/__1_0.distcp", sticky=True
    )
    first = job(output, 2)
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert [(r["rank"], r["epoch"], r["global_step"]) for r in first] == [(0, 2, 8), (1, 2, 8)]
    for report in first:  # one decision for all ranks
        result = report["last_result"]
        assert (result["attempts"], result["errors"], result["redirected"]) == (2, ["EIO"], False)
    [name] = os.listdir(output)  # top-1: the epoch 0 checkpoint was removed; nothing staged
    assert name == "epoch=1-step=8.ckpt"
    assert sorted(os.listdir(output / name)) == CHECKPOINT_FILES
    assert abs(weight_sum(output / name, tmp_path) - first[0]["weight_sum"]) < 1e-4

    resumed = job(output, 3, resume=str(output / name))
    assert [(r["epoch"], r["global_step"]) for r in resumed] == [(3, 12), (3, 12)]
    assert sorted(os.listdir(output / "epoch=2-step=12.ckpt")) == CHECKPOINT_FILES


def test_a_checkpoint_that_does_not_fit_lands_whole_in_the_fallback_and_resumes_from_there(
    tmpfs, tmp_path
):
    target = tmpfs(size="64k").path  # each shard fits, the whole checkpoint does not
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    environment = {"FSPROBE_FALLBACK_DIRS": str(fallback)}
    first = job(target, 2, **environment)
    requested = target / "epoch=1-step=8.ckpt"
    for report in first:
        result = report["last_result"]
        assert result["redirected"] and result["requested_path"] == str(requested)
    assert os.listdir(target) == []  # nothing of it at the target
    copy = Path(first[0]["last_result"]["path"])
    assert str(copy).startswith(str(fallback)) and sorted(os.listdir(copy)) == CHECKPOINT_FILES
    # Top-k removed the epoch 0 checkpoint's redirected copy and its entry: one is pending.
    assert [entry.requested for entry in pending([str(fallback)])] == [str(requested)]

    resumed = job(target, 3, resume=str(requested), **environment)  # found where it landed
    assert [(r["epoch"], r["global_step"]) for r in resumed] == [(3, 12), (3, 12)]


def test_the_strategies_save_directories_exactly_when_lightning_does():
    assert FsprobeModelParallelStrategy().writes_directory()
    assert not FsprobeModelParallelStrategy(save_distributed_checkpoint=False).writes_directory()
    assert FsprobeFSDPStrategy(state_dict_type="sharded").writes_directory()
    assert not FsprobeFSDPStrategy(state_dict_type="full").writes_directory()
