"""Mutants that survive on purpose, each with the reason no test can or should kill it.

Keyed as the run prints them: ``<module> <scope>: <mutation> in `<source line>```. A key that
no longer matches anything is harmless; a survivor without a key fails the run. Only
equivalent mutants belong here (the program does the same thing either way), or mistakes no
machine could show; a survivor that a test could catch gets the test instead.
"""

from __future__ import annotations

EXPLAINED: dict[str, str] = {
    "fsprobe/model.py Severity: 2 -> 3 in `UNHEALTHY = 2`": (
        "equivalent: severities are only compared (worst first, max); the status comes from "
        "_SEVERITY_STATUS and the JSON from the label, never from the number"
    ),
    "fsprobe/policy.py _headroom_reasons: or -> and in `if ratio is None or left is None:`": (
        "equivalent: ratio and left come from the same binding limit, so they are None "
        "together or not at all"
    ),
    "fsprobe/policy.py Policy: 60.0 -> 61.0 in "
    "`return self.intervals.get(probe, DEFAULT_INTERVALS.get(probe, 60.0))`": (
        "unreachable: every probe kind has a default interval, so the last fallback is never read"
    ),
    "fsprobe/model.py binding_phrase: 1 -> 2 in "
    '`kind, _, pool = limited_by.split(":", 1)[1].partition("@")`': (
        "equivalent: the source is 'quota:<type>' or 'quota:<type>@<pool>', one colon; "
        "maxsplit 1 or 2 splits the same"
    ),
    "fsprobe/probing/statvfs.py probe_statvfs: .f_favail -> .f_ffree in "
    "`files_free=_count(stats.f_favail),`": (
        "equivalent on Linux: the kernel's statfs has no f_favail and glibc's statvfs() copies "
        "f_ffree into it (tests/policy/test_headroom_reserved.py)"
    ),
    "fsprobe/saving/file.py _io_failure: or -> and in "
    '`return FailedAttempt.of(stream.first_error, stream.first_error_step or "write")`': (
        "unreachable: AtomicFile records the step together with the first error, so the step "
        "is never missing when the error is there"
    ),
    "fsprobe/saving/file.py _write_once: or -> and in "
    "`stream.first_error, stream.first_error_step or progress.step`": (
        "unreachable: AtomicFile records the step together with the first error, so the step "
        "is never missing when the error is there"
    ),
    "fsprobe/redirect/sync.py _copy_back: 384 -> 385 in "
    "`with TempFile(target_dir, temp_name(final), 0o600, readable=True) as temp:`": (
        "no effect a reader can meet: the next statement sets the copy's own mode with fchmod "
        "before a byte is written, and the extra other-execute bit grants no read meanwhile"
    ),
    "fsprobe/probing/write.py _Rehearsal: call deleted in `self.temp.release()`": (
        "equivalent: discard() releases in its own finally, and release is idempotent; the "
        "probe closes its file either way (tests/probing/test_write_probe_faults.py counts "
        "descriptors)"
    ),
    "fsprobe/redirect/manifest.py is_superseded: > -> >= in "
    "`return original is not None and original.st_mtime > entry.time`": (
        "no meaning at the boundary: a checkpoint written at the very nanosecond its "
        "redirected copy was recorded cannot be told older or newer, and no test can make one"
    ),
    "fsprobe/redirect/manifest.py OpenCopy.remove: False -> True in `return False`": (
        "only reachable in a race inside forget(): the fallback copy replaced between its open "
        "and its removal; forget() would then list a file it left in place (nothing is lost), "
        "and no test can time that window"
    ),
    "fsprobe/posix/atomic.py TempFile.__init__: 384 -> 385 in "
    "`self, dir_fd: int | None, name: str, mode: int = 0o600, readable: bool = False`": (
        "no effect a reader can meet: only the write probe takes the default, for a file of "
        "junk bytes it removes when the probe ends; an extra other-execute bit grants no read"
    ),
    "fsprobe/posix/atomic.py TempFile.__init__: False -> True in "
    "`self, dir_fd: int | None, name: str, mode: int = 0o600, readable: bool = False`": (
        "equivalent: only the write probe takes the default, and it never reads its file; a "
        "descriptor open for reading too writes the same bytes"
    ),
    "fsprobe/posix/atomic.py TempFile.__init__: call deleted in `self.discard()`": (
        "only reachable in a race: another process taking the lock of a file created an instant "
        "before with O_EXCL (a cleanup testing liveness in that instant); no test can time it"
    ),
    "fsprobe/posix/atomic.py TempFile.replace_if_unchanged: True -> False in "
    "`self.renamed = True`": (
        "equivalent: the temp name was unlinked just before, so the discard() that a temp not "
        "renamed gets on the way out finds nothing under that name (each name has its own token)"
    ),
    "fsprobe/posix/atomic.py TempFile.release: 1 -> 2 in `fd, self.fd = self.fd, -1`": (
        "equivalent: a released TempFile's descriptor is only ever compared with 0; -1 and -2 "
        "both say closed"
    ),
    "fsprobe/posix/atomic.py TempFile.replace_if_unchanged: False -> True in "
    "`moved = os.stat(aside, dir_fd=self.dir_fd, follow_symlinks=False)`": (
        "no effect: followed, a symlink put at the final name compares equal only when it points "
        "at the very version seen before the copy, and the copy then replaces the link itself "
        "(unlink and link never follow one); not followed, the link is put back and the copy "
        "waits. Either way nothing is written through the link"
    ),
    "fsprobe/redirect/manifest.py record: > -> >= in `if size > COMPACT_BYTES:`": (
        "no meaning at the boundary: compacting a manifest of exactly 1 MiB or one line later "
        "keeps the same entries (the latest per file), a quarter of the read cap away"
    ),
    "fsprobe/posix/staging.py Staging.swap_in: True -> False in `self.published = True`": (
        "equivalent at all three places: `published` only decides whether close() removes the "
        "staging name, and after any publish that name is gone (renamed) or held the replaced "
        "checkpoint, which publish() removes itself (tests/saving/test_save_dir.py checks both "
        "paths leave nothing and log nothing)"
    ),
    "fsprobe/posix/staging.py Staging.swap_in: False -> True in "
    "`os.stat(self.name, dir_fd=self.parent_fd, follow_symlinks=False)`": (
        "equivalent: a symlink at the checkpoint's path is refused either way, by the "
        "O_NOFOLLOW open of the old checkpoint or by rename(2) of a directory onto a "
        "non-directory (ENOTDIR); test_a_symlink_where_the_checkpoint_goes_is_not_replaced"
    ),
    "fsprobe/redirect/manifest.py _read: + -> - in "
    "`while line := stream.readline(left + 1):  # never more than the cap, even in one line`": (
        "equivalent: the file was checked to be within the cap before reading, so the bound "
        "only matters for the last line of a manifest exactly at the cap, and then it leaves "
        "unread only that line's newline (the entry is still read whole; "
        "test_a_manifest_up_to_its_size_limit_is_read_and_one_byte_more_is_not pads before it)"
    ),
    "fsprobe/redirect/manifest.py _read: 1 -> 2 in "
    "`while line := stream.readline(left + 1):  # never more than the cap, even in one line`": (
        "equivalent: one byte more or two past what is left is refused all the same by the "
        "`left < 0` check that follows the read"
    ),
    "fsprobe/redirect/manifest.py OpenCopy.remove: False -> True in "
    "`named = os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)`": (
        "no effect a neighbour can use: the copy's directory is inside an area proven to be "
        "its user's alone on the way in, so a symlink there is the user's own, and the unlink "
        "that follows removes the name, never what it points to"
    ),
    "fsprobe/redirect/manifest.py OpenCopy._open: False -> True in "
    "`info = os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)`": (
        "equivalent in what it allows: a symlink taken for a directory is then opened with "
        "O_NOFOLLOW and refused all the same (only the error's wording differs)"
    ),
}
