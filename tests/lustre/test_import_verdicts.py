"""What fsprobe says of each import state, case by case, as a Lustre admin reads it.

Each case (tests/fixtures/lfs/imports/*.json) is a state history built from the lustre-release
source lines it cites (file, function, tag, lines), printed by the fake `lctl`
(tests/support/fakes/lctl) at times relative to now, and judged by a real `fsprobe check`.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from fsprobe.report import Report
from fsprobe.units import format_clock
from tests.support.cli import check_json
from tests.support.fakes.fake_lfs import fake_lfs_for

CASES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "lfs" / "imports"
CASES = {path.stem: json.loads(path.read_text()) for path in sorted(CASES_DIR.glob("*.json"))}
AS_USER = ["--user", "1000", "--group", "1000"]


@pytest.fixture
def fake_lfs(monkeypatch, tmp_path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def at_now(imports: dict[str, Any], now: int) -> dict[str, Any]:
    """The fake lctl's state with the case's times (seconds before now) made absolute."""
    targets = {
        name: {**own, "history": [[now + ago, state] for ago, state in own["history"]]}
        for name, own in imports["targets"].items()
    }
    return {"now": now, "targets": targets}


def clocks(text: str, now: int) -> str:
    """`text` with each ``{-300}`` made the clock time 300 s before now."""
    return re.sub(r"\{(-[0-9]+)\}", lambda m: format_clock(now + int(m[1]), now), text)


def test_every_case_cites_the_lustre_source_it_was_built_from():
    assert len(CASES) >= 9
    for name, case in CASES.items():
        assert case["source"], name
        for source in case["source"]:
            assert source["tag"] == "v2_17_0" and source["file"].startswith("lustre/"), name
            assert source["function"] and source["lines"] and source["says"], name


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_import_state_is_judged_as_lustre_means_it(faultfs, fake_lfs, name):
    case = CASES[name]
    now = int(time.time())
    fake_lfs.configure(
        version="2.17",
        control=faultfs.ctl.socket_path,
        imports=at_now(case["imports"], now),
        fail=case.get("lfs_fail"),
        mdts=case.get("mdts"),
        state=case.get("lfs_state"),
    )
    code, document = check_json(
        faultfs.mountpoint, "--quota-provider", "lfs", "--no-write-probe", *AS_USER
    )
    expect = case["expect"]
    assert document["probes"]["imports"]["ok"], document["probes"]["imports"]
    assert document["status"] == expect["status"], document["reasons"]
    assert [r["code"] for r in document["reasons"]] == expect["reasons"]
    if "message" in expect:
        assert clocks(expect["message"], now) in document["reasons"][0]["message"]
    connected = {t["name"]: t["connected"] for t in document["lustre_imports"]}
    assert {name: connected[name] for name in expect["connected"]} == expect["connected"]
    verdict = Report.from_dict(document).verdict
    assert verdict.can_take_save is expect["can_take_save"]
    if "worth_waiting" in expect:
        assert verdict.worth_waiting is expect["worth_waiting"]
    assert code == (0 if expect["status"] == "ok" else 1)
