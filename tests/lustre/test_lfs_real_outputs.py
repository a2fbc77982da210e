"""fsprobe's readers against outputs real systems printed (tests/fixtures/lfs/real).

Each fixture quotes one output of a command fsprobe runs, as a public page shows it with its
spacing intact, and cites the page; the parse expected is written from the sample's own numbers.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from fsprobe.lustre.df_parser import parse_df
from fsprobe.lustre.imports import parse_states
from fsprobe.lustre.quota_parser import parse_quota
from tests.lustre.test_lfs_df_parser import check_output as check_df
from tests.lustre.test_lfs_quota_parser import check_output as check_quota
from tests.support.fakes.fake_lfs import load_fixtures

CASES = load_fixtures("real")
KINDS = {"quota", "df", "lctl"}
#: The instance of a client mount put in place of a server's, to read the same lines as a
#: mount's (the instance `lfs getname` prints is the superblock's address).
CLIENT_INSTANCE = "ffff8f1c2a3b4000"


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _in_bytes(expect: dict[str, Any]) -> dict[str, Any]:
    """`expect` of a df sample, its KiB values (as printed) turned into bytes."""
    scaled = copy.deepcopy(expect)
    unit = {"KiB": 1024, "inodes": 1}[scaled.pop("unit")]
    for block in scaled["filesystems"]:
        for row in block["targets"] + ([block["summary"]] if block["summary"] else []):
            for key in ("total", "used", "available"):
                row[key] *= unit
    return scaled


def _read_at(stdout: str) -> float:
    """When lctl printed `stdout`: the time of its latest state change (no later moment is
    known)."""
    return float(max((int(at) for at in re.findall(r"^ - \[ ([0-9]+),", stdout, re.M)), default=0))


def _imports(mounts) -> list[list[Any]]:
    return [
        [t.name, t.state, t.lost_at and int(t.lost_at), t.last_eviction and int(t.last_eviction)]
        for imports in mounts.values()
        for t in imports
    ]


def test_every_sample_cites_its_page_and_is_a_command_fsprobe_runs():
    assert {name.split("/")[0] for name, _ in CASES} == KINDS
    assert len(CASES) >= 9
    for name, case in CASES:
        source = case["source"]
        assert source["url"].startswith("https://") and source["read"], name
        assert case["command"].split()[:2] in (
            ["lfs", "quota"],
            ["lfs", "df"],
            ["lctl", "get_param"],
        ), name
        assert "-h" not in case["command"].split(), f"{name}: fsprobe never asks for -h"


@pytest.mark.parametrize(("name", "case"), CASES, ids=[name for name, _ in CASES])
def test_a_real_output_reads_as_its_numbers_say(name: str, case: dict[str, Any]):
    stdout, stderr = _text(case["stdout"]), _text(case["stderr"])
    kind = name.split("/")[0]
    if kind == "quota":
        check_quota(parse_quota(stdout, stderr, case["status"]), case["expect"])
    elif kind == "df":
        check_df(parse_df(stdout, stderr, case["status"]), _in_bytes(case["expect"]))
    else:
        mounts = parse_states(stdout, _read_at(stdout))
        assert [list(mount) for mount in mounts] == case["expect"]["mounts"]


def test_a_servers_own_imports_are_read_but_are_no_mount_of_the_node():
    """The MDS sample's lines are those of a client's imports but for the instance: read as a
    client mount's, they give the states and the loss its history shows."""
    case = dict(CASES)["lctl/mds_osc_states"]
    stdout = _text(case["stdout"])
    assert parse_states(stdout, _read_at(stdout)) == {}
    as_client = stdout.replace("-osc-MDT0000.state=", f"-osc-{CLIENT_INSTANCE}.state=")
    mounts = parse_states(as_client, _read_at(as_client))
    assert list(mounts) == [("tesfs", CLIENT_INSTANCE)]
    assert _imports(mounts) == case["expect"]["imports_as_a_client"]
