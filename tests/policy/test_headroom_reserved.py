"""Headroom is what an unprivileged writer can take: ``f_bavail``, not ``f_bfree``.

See docs/design.md §4.

ext4 reserves 5 % of its blocks for root by default, and Lustre's OSTs keep their own reserve:
``f_bfree`` counts those blocks, a training job cannot use them. On tmpfs the two are equal, so
only a filesystem that reports them apart shows which one fsprobe reads; the fault filesystem
reports whatever numbers the test sets, through the real statfs(2) path of the kernel.

Inodes: Linux has no ``f_favail`` of its own. The kernel's statfs carries ``f_ffree`` only,
and glibc's statvfs() copies it into ``f_favail``, so on Linux the two can never differ and
reading either is the same (the mutation run lists ``f_favail`` -> ``f_ffree`` as equivalent).
The inode test below pins what can be pinned: the free inodes fsprobe reports are the ones the
filesystem reports, not the backing filesystem's and not the total.
"""

from __future__ import annotations

import os

import fsprobe
from fsprobe.model import Status
from fsprobe.probing.statvfs import probe_statvfs
from tests.support.state import STATVFS_ONLY

BLOCK = 4096
TOTAL = 100_000


def reason_codes(report) -> set[str]:
    return {reason.code for reason in report.verdict.reasons}


def test_space_headroom_follows_f_bavail_not_f_bfree(faultfs):
    # Half the blocks are free, but all but 2 % of those are reserved for root.
    faultfs.ctl.set_statfs(
        f_bsize=BLOCK, f_frsize=BLOCK, f_blocks=TOTAL, f_bfree=TOTAL // 2, f_bavail=2_000
    )
    seen = os.statvfs(faultfs.mountpoint)
    assert (seen.f_bfree, seen.f_bavail) == (TOTAL // 2, 2_000)  # the kernel passed both on

    info = probe_statvfs(str(faultfs.mountpoint))
    assert info.avail_bytes == 2_000 * BLOCK
    assert info.size_bytes == TOTAL * BLOCK

    report = fsprobe.check(str(faultfs.mountpoint), STATVFS_ONLY)
    assert report.verdict.headroom.bytes == 2_000 * BLOCK
    assert report.verdict.headroom.bytes_ratio == 0.02
    assert report.status is Status.UNHEALTHY  # 2 % < 3 %; f_bfree would say 50 %: ok
    assert "space_headroom_low" in reason_codes(report)
    assert report.to_dict()["filesystem"]["avail_bytes"] == 2_000 * BLOCK


def test_reserved_blocks_do_not_count_for_a_checkpoint_that_needs_them(faultfs):
    faultfs.ctl.set_statfs(
        f_bsize=BLOCK, f_frsize=BLOCK, f_blocks=TOTAL, f_bfree=TOTAL // 2, f_bavail=20_000
    )
    fits = fsprobe.check(str(faultfs.mountpoint), STATVFS_ONLY, need_bytes=20_000 * BLOCK)
    too_big = fsprobe.check(str(faultfs.mountpoint), STATVFS_ONLY, need_bytes=20_000 * BLOCK + 1)
    assert (fits.verdict.fits, too_big.verdict.fits) == (True, False)


def test_inode_headroom_is_the_free_inodes_the_filesystem_reports(faultfs):
    faultfs.ctl.set_statfs(f_files=TOTAL, f_ffree=2_000)
    seen = os.statvfs(faultfs.mountpoint)
    assert seen.f_favail == seen.f_ffree == 2_000  # Linux: glibc copies f_ffree

    info = probe_statvfs(str(faultfs.mountpoint))
    assert (info.files, info.files_free) == (TOTAL, 2_000)
    report = fsprobe.check(str(faultfs.mountpoint), STATVFS_ONLY)
    assert report.verdict.headroom.inodes == 2_000
    assert report.status is Status.UNHEALTHY
    assert "inode_headroom_low" in reason_codes(report)
