"""Reading where a new file lands: `lfs getstripe -d -y`, `lfs pool_list`, `lfs getname` and
`lfs --version`, in the forms of every Lustre version (tests/fixtures/lfs/layout)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.layout import Component, Layout, parse_layout
from fsprobe.lustre.placement import Placement
from fsprobe.lustre.pools import (
    fsname_from_mount,
    parse_getname_instance,
    parse_pool_members,
    parse_printed_version,
)
from fsprobe.lustre.runner import LfsRun
from fsprobe.model import LustreTarget, Mount
from tests.lustre.test_lfs_parser_robustness import damaged
from tests.support.fakes.fake_lfs import load_fixtures

CASES = load_fixtures("layout")


def run_of(case: dict[str, Any]) -> LfsRun:
    stdout = "".join(line + "\n" for line in case["stdout"])
    stderr = "".join(line + "\n" for line in case["stderr"])
    return LfsRun(tuple(case["command"].split()), stdout, stderr, case["status"], 0.0, 0.0)


def read(name: str, case: dict[str, Any]) -> object:
    run = run_of(case)
    kind = name.split("/")[0]
    if kind == "getstripe":
        layout = parse_layout(run)
        return {
            "components": [{"pool": c.pool, "on_mdt": c.on_mdt} for c in layout.components],
            "pools": list(layout.pools),
            "anywhere": layout.anywhere,
            "composite": layout.composite,
            "inherits_pool": layout.inherits_pool,
        }
    if kind == "pool_list":
        fsname, pool = case["command"].split()[-1].split(".")
        return {"members": sorted(parse_pool_members(run, fsname, pool))}
    if kind == "getname":
        return {"fsname": parse_getname_instance(run)[0]}
    assert kind == "version"
    return {"version": list(parse_printed_version(run)[0])}


@pytest.mark.parametrize(("name", "case"), CASES, ids=[name for name, _ in CASES])
def test_every_sample_reads_as_expected(name: str, case: dict[str, Any]):
    expect = case["expect"]
    if "failure" in expect:
        with pytest.raises(ProbeFailure) as failure:
            read(name, case)
        assert failure.value.error == expect["failure"]
        assert case["command"] in failure.value.message  # says which run it could not read
        for said in case["stderr"]:
            assert said in failure.value.message  # and what lfs said
    else:
        assert read(name, case) == expect


def test_the_samples_cover_every_version_and_form():
    versions = {case["version"] for name, case in CASES if name.startswith("getstripe/")}
    assert versions == {"2.12", "2.14", "2.15", "2.16"}
    composite = {case["version"] for name, case in CASES if name.startswith("getstripe/pfl")}
    assert {"2.14", "2.16"} <= composite  # componentN keys, and the 2.16 list


@pytest.mark.parametrize(
    ("source", "fsname"),
    [
        ("10.0.0.1@tcp:/scratch", "scratch"),
        ("10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib:/lustre", "lustre"),
        ("mgs@tcp:/work/projects/a", "work"),  # a subdirectory mount (fileset)
        ("/dev/fuse", None),
        ("faultfs", None),
    ],
)
def test_the_filesystem_name_is_the_mount_source_after_the_last_colon_slash(source, fsname):
    assert fsname_from_mount(Mount("/mnt/x", "lustre", source, "0:42", False)) == fsname
    assert fsname_from_mount(None) is None


def _ost(index: int) -> LustreTarget:
    return LustreTarget(f"lustre-OST{index:04x}", "OST", index, 100, 50, None, None)


def test_a_placement_marks_the_osts_a_new_file_can_reach():
    mdt = LustreTarget("lustre-MDT0000", "MDT", 0, 100, 50, 10, 5)
    members = {"flash": frozenset({"lustre-OST0000", "lustre-OST0001"})}
    pooled = Placement(Layout((Component("flash"),), composite=False), members)
    marked = pooled.mark((mdt, _ost(0), _ost(1), _ost(2)))
    assert marked[0] == mdt
    assert [(t.pools, t.in_layout) for t in marked[1:]] == [
        (("flash",), True),
        (("flash",), True),
        ((), False),
    ]
    tail_anywhere = Placement(Layout((Component("flash"), Component(None)), True), members)
    assert [t.in_layout for t in tail_anywhere.mark((_ost(0), _ost(2)))] == [True, True]
    assert [t.pools for t in tail_anywhere.mark((_ost(0), _ost(2)))] == [("flash",), ()]


LAYOUT_SAMPLES = [case["stdout"] for name, case in CASES if name.startswith("getstripe/")]
READERS = {
    "getstripe": parse_layout,
    "pool_list": lambda run: parse_pool_members(run, "lustre", "flash"),
    "getname": parse_getname_instance,
    "version": parse_printed_version,
}


@settings(max_examples=200)
@given(
    st.sampled_from(sorted(READERS)),
    st.one_of(st.text(), damaged(LAYOUT_SAMPLES).map(lambda lines: "\n".join(lines) + "\n")),
    st.integers(min_value=-64, max_value=300),
)
def test_any_text_reads_or_is_refused_with_a_name_never_an_exception(kind, stdout, status):
    run = LfsRun(("lfs", kind), stdout, "", status, 0.0, 0.0)
    try:
        value = READERS[kind](run)
    except ProbeFailure as failure:
        assert failure.error and "lfs " + kind in failure.message
    else:
        assert status == 0
        if isinstance(value, Layout):
            assert value.components and all(
                c.pool is None or c.pool.strip() for c in value.components
            )
