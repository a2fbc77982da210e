"""What the mutation run mutates, and which tests must notice (issue 12.6).

The places users trust most: the policy that judges, the save path that must not lose a
checkpoint (write, retry, redirect, sync back), the state file's trust check, the quota
parser's markers and the IDs a quota is charged to. Each target names a module, the scopes in
it (qualnames; ``*`` for the whole module) and the tests that cover it: the run is fast because
it runs only those, and honest because a survivor then means "these tests do not notice".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    module: str  # path from the repository root
    scopes: frozenset[str]
    tests: tuple[str, ...]


def target(name: str, module: str, scopes: str, *tests: str) -> Target:
    return Target(name, module, frozenset(scopes.split()), tests)


_POLICY_TESTS = (
    "tests/policy/test_policy.py",
    "tests/policy/test_thresholds.py",
    "tests/package/test_defaults_documented.py",
    "tests/policy/test_policy_combinations.py",
)
_QUOTA_TESTS = (
    "tests/quota/test_quota_provider.py",
    "tests/lustre/test_lfs_quota_parser.py",
    "tests/lustre/test_lfs_parser_robustness.py",
    "tests/lustre/test_lfs_quota_markers.py",
    "tests/policy/test_thresholds.py",
)
#: Fastest first: the run stops at the first failing test, so a mutant dies sooner.
_SAVE_TESTS = (
    "tests/saving/test_save_atomic.py",
    "tests/saving/test_durability.py",
    "tests/saving/test_save_deadline.py",
    "tests/redirect/test_trust_fallback.py",
    "tests/attacks/test_attack_fallback.py",
    "tests/redirect/test_redirect_sync.py",
    "tests/redirect/test_sync_dir.py",
    "tests/saving/test_save_stale.py",
    "tests/saving/test_save_faults.py",
)

TARGETS = (
    target("policy", "fsprobe/policy.py", "*", *_POLICY_TESTS),
    target("levels", "fsprobe/model.py", "Level Severity", *_POLICY_TESTS),
    target(
        "save-answer",
        "fsprobe/model.py",
        "binding_phrase full_errno fit_need SaveAnswer.fit",
        *_POLICY_TESTS,
    ),
    target(
        "quota-state",
        "fsprobe/model.py",
        "QuotaUsage.state_at QuotaUsage.remaining",
        *_POLICY_TESTS,
    ),
    target(
        "state-trust",
        "fsprobe/state.py",
        "ensure_state_dir StateReader.read default_state_dir",
        "tests/documents/test_state_trust.py",
        "tests/daemon/test_config.py",
    ),
    target(
        "quota-markers",
        "fsprobe/lustre/quota_parser.py",
        "_used _limit _usage _split _StdoutReader._row "
        "Usage.inaccurate QuotaRow.inaccurate QuotaOutput.inaccurate",
        *_QUOTA_TESTS,
    ),
    target("quota-usage", "fsprobe/lustre/provider.py", "_limit usage_from_cells", *_QUOTA_TESTS),
    target("quota-ids", "fsprobe/quota/ids.py", "*", "tests/quota/test_quota_ids.py"),
    target("lustre-layout", "fsprobe/lustre/layout.py", "*", "tests/lustre/test_lfs_layout.py"),
    target(
        "lustre-placement",
        "fsprobe/lustre/placement.py",
        "Placement.pools_of Placement.reaches Placement.mark",
        "tests/lustre/test_lfs_layout.py",
    ),
    target(
        "statvfs",
        "fsprobe/probing/statvfs.py",
        "probe_statvfs",
        "tests/policy/test_headroom_reserved.py",
        "tests/cli/test_check_faults.py",
    ),
    target(
        "write-probe",
        "fsprobe/probing/write.py",
        "*",
        "tests/probing/test_write_probe.py",
        "tests/probing/test_write_probe_faults.py",
        "tests/saving/test_durability.py",
    ),
    target(
        "save-write",
        "fsprobe/saving/file.py",
        "AtomicFile.sync AtomicFile.close AtomicFile.size _io_failure _write_once _remove_temp",
        *_SAVE_TESTS,
    ),
    target(
        "save-retry",
        "fsprobe/saving/retry.py",
        "first_os_error failure_of deciding RetryState.fallback RetryState.failed "
        "RetryState.follow RetryState.prepare start attempt_until_done run_attempts",
        *_SAVE_TESTS,
    ),
    target(
        "save-options",
        "fsprobe/saving/options.py",
        "Backoff.delay SaveOptions.__post_init__ SaveOptions.resolved save_options",
        "tests/saving/test_save_options.py",
        *_SAVE_TESTS,
    ),
    target(
        "save-atomic",
        "fsprobe/posix/atomic.py",
        "fsync_directory TempFile.__init__ TempFile.rename TempFile.replace_if_unchanged "
        "TempFile.discard TempFile.release same_version",
        *_SAVE_TESTS,
    ),
    target("save-redirect", "fsprobe/redirect/areas.py", "*", *_SAVE_TESTS),
    target("save-fallbacks", "fsprobe/redirect/fallback.py", "*", *_SAVE_TESTS),
    target("save-sync", "fsprobe/redirect/sync.py", "_copy_back _sync_open", *_SAVE_TESTS),
    target("save-copy", "fsprobe/redirect/copies.py", "copy_bytes", *_SAVE_TESTS),
    target(
        "save-manifest",
        "fsprobe/redirect/manifest.py",
        "sha256_of_fd OpenCopy._open OpenCopy.digest OpenCopy.remove _read record is_superseded",
        *_SAVE_TESTS,
    ),
    target(
        "save-staging",
        "fsprobe/posix/staging.py",
        "Staging.sync Staging.swap_in Staging.sync_parent Staging.publish",
        "tests/saving/test_save_dir.py",
        "tests/saving/test_durability.py",
        "tests/saving/test_save_deadline.py",
    ),
    target(
        "save-dir",
        "fsprobe/saving/directory.py",
        "write_directory_once",
        "tests/saving/test_save_dir.py",
        "tests/saving/test_durability.py",
        "tests/saving/test_save_deadline.py",
    ),
)
