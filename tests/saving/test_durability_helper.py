"""The durability checks bite: each rule of tests/support/durability.py fails on a journal that
breaks it, and the fault filesystem's journal records real calls in order with their errno."""

from __future__ import annotations

import os

import pytest

from tests.support.durability import (
    Call,
    NotDurable,
    check_directory_published,
    check_file_published,
    read_journal,
)


def journal(*calls: tuple) -> list[Call]:
    """Calls from ``(op, path, ...)`` tuples; a trailing ``"!EIO"`` marks a failed call."""
    made = []
    for index, (op, *rest) in enumerate(calls):
        error = rest.pop()[1:] if rest and rest[-1].startswith("!") else None
        made.append(Call(index, op, tuple(rest), error))
    return made


TEMP, FINAL = "/ckpt/.model.pt.tmp", "/ckpt/model.pt"
DURABLE = [
    ("create", TEMP),
    ("write", TEMP),
    ("write", TEMP),
    ("flush", TEMP),
    ("fsync", TEMP),
    ("release", TEMP),
    ("rename", TEMP, FINAL),
    ("opendir", "/ckpt"),
    ("fsyncdir", "/ckpt"),
]


def without(calls: list[tuple], op: str) -> list[tuple]:
    return [call for call in calls if call[0] != op]


def test_the_textbook_sequence_passes_and_names_its_rename():
    assert check_file_published(journal(*DURABLE), FINAL).paths == (TEMP, FINAL)


@pytest.mark.parametrize(
    ("calls", "complaint"),
    [
        (without(DURABLE, "fsync"), "not fsynced after its last write"),
        (without(DURABLE, "fsyncdir"), "/ckpt was not fsynced after"),
        (without(DURABLE, "rename"), "nothing was renamed onto"),
        # the data fsync after the rename: a crash in between leaves a torn file
        (
            [*DURABLE[:4], DURABLE[6], DURABLE[4], *DURABLE[7:]],
            "not fsynced after its last write",
        ),
        # the directory fsync before the rename does not make the rename durable
        ([*DURABLE[:6], *DURABLE[7:], DURABLE[6]], "/ckpt was not fsynced after"),
        # a write after the fsync is not covered by it
        ([*DURABLE[:5], ("write", TEMP), *DURABLE[5:]], "not fsynced after its last write"),
        # a fsync that failed is no fsync
        ([*DURABLE[:4], ("fsync", TEMP, "!EIO"), *DURABLE[5:]], "not fsynced"),
        ([*DURABLE[:8], ("fsyncdir", "/ckpt", "!EIO")], "/ckpt was not fsynced"),
        # a fsync of another file, or of another directory, does not count
        ([*DURABLE[:4], ("fsync", "/ckpt/other"), *DURABLE[5:]], "not fsynced"),
        ([*DURABLE[:8], ("fsyncdir", "/")], "/ckpt was not fsynced"),
        # a failed rename publishes nothing
        ([*DURABLE[:6], ("rename", TEMP, FINAL, "!EIO"), *DURABLE[7:]], "nothing was renamed"),
    ],
    ids=[
        "no-fsync",
        "no-dir-fsync",
        "no-rename",
        "fsync-after-rename",
        "dir-fsync-before-rename",
        "write-after-fsync",
        "failed-fsync",
        "failed-dir-fsync",
        "fsync-of-another-file",
        "fsync-of-another-dir",
        "failed-rename",
    ],
)
def test_each_rule_bites(calls, complaint):
    with pytest.raises(NotDurable, match=complaint):
        check_file_published(journal(*calls), FINAL)


def test_only_the_last_rename_onto_the_final_name_counts():
    durable = [(op, *(p.replace(".model", ".first") for p in rest)) for op, *rest in DURABLE]
    unsynced = without(DURABLE, "fsync")
    with pytest.raises(NotDurable):
        check_file_published(journal(*durable, *unsynced), FINAL)
    check_file_published(journal(*unsynced, *durable), FINAL)


STAGING, DONE = "/run/.staging", "/run/checkpoint-100"
DIRECTORY_DURABLE = [
    ("mkdir", STAGING),
    ("create", f"{STAGING}/a.bin"),
    ("write", f"{STAGING}/a.bin"),
    ("fsync", f"{STAGING}/a.bin"),
    ("mkdir", f"{STAGING}/shards"),
    ("create", f"{STAGING}/shards/.0.tmp"),
    ("write", f"{STAGING}/shards/.0.tmp"),
    ("fsync", f"{STAGING}/shards/.0.tmp"),
    ("rename", f"{STAGING}/shards/.0.tmp", f"{STAGING}/shards/0.distcp"),
    ("fsyncdir", f"{STAGING}/shards"),
    ("fsyncdir", STAGING),
    ("rename", STAGING, DONE),
    ("fsyncdir", "/run"),
]


def test_a_directory_save_in_textbook_order_passes():
    assert check_directory_published(journal(*DIRECTORY_DURABLE), DONE).paths == (STAGING, DONE)


@pytest.mark.parametrize(
    ("drop", "complaint"),
    [
        (3, "file /run/.staging/a.bin not fsynced"),
        (7, "file /run/.staging/shards/0.distcp not fsynced"),  # followed through its rename
        (9, "directory /run/.staging/shards not fsynced"),
        (10, "directory /run/.staging not fsynced"),
        (12, "/run was not fsynced after"),
    ],
)
def test_a_directory_save_missing_any_fsync_fails(drop, complaint):
    calls = [call for index, call in enumerate(DIRECTORY_DURABLE) if index != drop]
    with pytest.raises(NotDurable, match=complaint):
        check_directory_published(journal(*calls), DONE)


def test_a_directory_changed_after_its_fsync_needs_another():
    late = [*DIRECTORY_DURABLE[:11], ("create", f"{STAGING}/late"), *DIRECTORY_DURABLE[11:]]
    with pytest.raises(NotDurable, match=r"directory /run/\.staging not fsynced") as raised:
        check_directory_published(journal(*late), DONE)
    assert "file /run/.staging/late not fsynced" in str(raised.value)


def test_a_file_removed_from_the_staging_tree_needs_no_fsync():
    removed = [
        *DIRECTORY_DURABLE[:10],
        ("create", f"{STAGING}/scratch"),
        ("unlink", f"{STAGING}/scratch"),
        *DIRECTORY_DURABLE[10:],
    ]
    check_directory_published(journal(*removed), DONE)


def test_the_journal_records_real_calls_in_order_with_their_outcome(faultfs):
    mnt = faultfs.mountpoint
    faultfs.ctl.clear_journal()
    faultfs.ctl.fail("fsync", "EIO", path="/b")
    with open(mnt / "b", "wb") as f:
        f.write(b"x")
        f.flush()
        with pytest.raises(OSError):
            os.fsync(f.fileno())
    os.rename(mnt / "b", mnt / "c")
    dir_fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    calls = [(c.op, c.paths, c.error) for c in read_journal(faultfs)]
    wanted = [
        ("create", ("/b",), None),
        ("write", ("/b",), None),
        ("fsync", ("/b",), "EIO"),
        ("rename", ("/b", "/c"), None),
        ("fsyncdir", ("/",), None),
    ]
    assert [
        call for call in calls if call[0] in {"create", "write", "fsync", "rename", "fsyncdir"}
    ] == wanted
    assert ("getattr", ("/b",), None) not in calls  # not journaled: it would bury the rest
    with pytest.raises(NotDurable, match="/b was not fsynced"):
        check_file_published(read_journal(faultfs), "/c")
    faultfs.ctl.clear_journal()
    assert read_journal(faultfs) == []
