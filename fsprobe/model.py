"""What the probes observe: plain, immutable values that every other part of fsprobe shares.

Nothing here knows how a value was obtained or where it goes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fsprobe.units import format_bytes, format_count

T = TypeVar("T")

#: The probe kinds, in the order in which they are shown and exported.
PROBE_KINDS = ("statvfs", "quota", "lfs_df", "imports", "write", "tmpdir")

#: Inodes a save needs unless told otherwise: it writes at least one file.
NEED_INODES = 1

#: The error name a probe reports when it overran its deadline (an errno name otherwise).
TIMEOUT = "TIMEOUT"
#: The error name of a probe that raised something other than an OSError: a bug of fsprobe's,
#: contained in that probe (the policy's reason ``internal_error``), never a fact about the
#: filesystem.
INTERNAL = "INTERNAL"


class Level(enum.IntEnum):
    """An ordered scale whose members are written as lowercase labels (``"degraded"``) in the
    JSON, the metrics and the terminal: `Status` here, the policy's `Severity`."""

    @property
    def label(self) -> str:
        return self.name.lower()


class Status(Level):
    """Health of a target; the values are the exit codes of `fsprobe check` (monitoring plugins)."""

    OK = 0
    DEGRADED = 1
    UNHEALTHY = 2
    UNKNOWN = 3


class Severity(Level):
    """How much one reason weighs. A notice is worth knowing but leaves the status as it is."""

    NOTICE = 0
    DEGRADED = 1
    UNHEALTHY = 2

    @property
    def status(self) -> Status:
        """The status this reason alone gives a target."""
        return _SEVERITY_STATUS[self]


_SEVERITY_STATUS = {
    Severity.NOTICE: Status.OK,
    Severity.DEGRADED: Status.DEGRADED,
    Severity.UNHEALTHY: Status.UNHEALTHY,
}


#: Every code a `Reason` of the policy may carry: what a save event may name as the reason the
#: preflight redirected it (a label of a metric: a sender must not make up new ones).
REASON_CODES = frozenset(
    {
        "capacity_unknown",
        "inode_headroom_low",
        "internal_error",
        "lustre_target_disconnected",
        "lustre_target_evicted",
        "lustre_target_full",
        "lustre_target_inactive",
        "lustre_target_recovering",
        "mount_stuck",
        "probe_failed",
        "probe_stale",
        "quota_grace_expired",
        "quota_grace_expiring",
        "quota_hard_reached",
        "quota_note",
        "quota_soft_exceeded",
        "quota_unavailable",
        "readonly",
        "space_headroom_low",
        "target_untrusted",
        "tmpdir_cross_device",
        "tmpdir_too_small",
        "write_failed",
        "write_probe_refused",
        "write_slow",
    }
)


@dataclass(frozen=True)
class Reason:
    """Why a target is not plainly ok: a stable code for machines, a sentence for people, and
    what it means for a save.

    `errno` is set when a write into the target now fails (or hangs) because of this reason:
    the error it would get (``EROFS``, ``EDQUOT``, ``ENOSPC``, the test write's errno,
    ``ETIMEDOUT`` for a hung mount). `transient` says that the trouble stands in the way of a
    save now but is expected to pass, so that waiting for it is worth it (a hung mount, a
    transient write error, a very slow write, a stale or failed probe). Lack of room and
    refusals are not transient; nor are warnings about what has already passed or never
    stops a write (low headroom without a size to fit, a transient error whose next test
    write succeeded, a slowish write).
    """

    code: str
    severity: Severity
    message: str
    transient: bool = False
    errno: str | None = None


@dataclass(frozen=True)
class ProbeResult(Generic[T]):
    """One run of one probe: when, how long, and either a value or an error.

    `error` is an errno name (``"EIO"``), ``"TIMEOUT"`` or ``"INTERNAL"``; `stuck` means the
    run overran its deadline and its worker is still blocked in the kernel (a hung mount).
    `detail` is the traceback of an ``INTERNAL`` error, for the log of whoever records it (a
    probe worker has no log of its own).
    """

    probe: str
    started_at: float
    duration: float
    value: T | None = None
    error: str | None = None
    message: str = ""
    stuck: bool = False
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.stuck

    @property
    def finished_at(self) -> float:
        return self.started_at + self.duration


@dataclass(frozen=True)
class DirectoryOwner:
    """Owner, group and mode of the directory a statvfs probe looked at: who may write there
    (the daemon's rule for which save events it believes, `fsprobe.events.admission`)."""

    uid: int
    gid: int
    mode: int


@dataclass(frozen=True)
class Mount:
    """One line of the mount table: where a filesystem is mounted, its type and source."""

    mountpoint: str
    fstype: str
    source: str
    device: str  # "major:minor"
    readonly: bool


@dataclass(frozen=True)
class FilesystemInfo:
    """statvfs of the target (or its nearest existing ancestor) and the mount it lives on.

    `probed_path` is the directory that was judged: the target itself when `target_exists`,
    else its nearest existing parent (a mistyped path reads exactly like a new one, so every
    output says which it was).
    """

    probed_path: str
    mountpoint: str
    fstype: str
    device: str
    size_bytes: int
    avail_bytes: int
    files: int
    files_free: int
    readonly: bool
    st_dev: int
    target_exists: bool = True
    owner: DirectoryOwner | None = None


QUOTA_TYPES = ("user", "group", "project")


class QuotaState(str, enum.Enum):
    """Where usage stands against the limits, as the quota server sees it."""

    OK = "ok"
    SOFT_EXCEEDED = "soft_exceeded"
    GRACE_EXPIRED = "grace_expired"
    HARD_REACHED = "hard_reached"


@dataclass(frozen=True)
class QuotaUsage:
    """Usage and limits for one resource (bytes or inodes); ``None`` means "no limit"."""

    used: int
    soft: int | None = None
    hard: int | None = None
    grace_expires_at: float | None = None
    state: QuotaState = QuotaState.OK
    inaccurate: bool = False

    def state_at(self, now: float) -> QuotaState:
        """The state at time `now`: a grace timer read a while ago may have run out since."""
        if (
            self.state is QuotaState.SOFT_EXCEEDED
            and self.grace_expires_at is not None
            and self.grace_expires_at <= now
        ):
            return QuotaState.GRACE_EXPIRED
        return self.state

    def remaining(self, now: float) -> int | None:
        """What a new file can still take under the limit enforced at `now`; None if unlimited.

        The hard limit is always enforced; the soft limit only once its grace has expired, at
        which point nothing remains.
        """
        if self.state_at(now) is QuotaState.GRACE_EXPIRED:
            return 0
        if self.hard is None:
            return None
        return max(0, self.hard - self.used)


@dataclass(frozen=True)
class QuotaEntry:
    """The quota of one ID that a new file in the target is charged to.

    `pool` names the OST pool of a pool quota (Lustre 2.14+), which binds only the bytes that
    land on that pool's OSTs; None for the filesystem-wide quota of the ID.
    """

    type: str  # user | group | project
    id: int
    name: str | None
    bytes: QuotaUsage
    inodes: QuotaUsage
    pool: str | None = None

    @property
    def source(self) -> str:
        """How headroom names this quota: ``quota:user``, or ``quota:user@flash`` for a pool."""
        return f"quota:{self.type}" + (f"@{self.pool}" if self.pool else "")


@dataclass(frozen=True)
class QuotaReport:
    """Every quota that applies to the target, from one provider (``lfs`` for Lustre).

    `errors` say what could not be read; `notes` say why a quota one might expect is not asked
    for (a project ID without its inherit flag), one sentence each.
    """

    provider: str
    entries: tuple[QuotaEntry, ...]
    inaccurate: bool = False
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LustreTarget:
    """One MDT or OST as `lfs df` shows it; ``name`` is without ``_UUID``.

    `pools` are the OST pools of the target directory's layout that hold this OST;
    `in_layout` is False for an OST that the layout's pools leave out (no byte of a new file
    can land there). `unknown_state` holds the status bits the server set that `lfs` has no
    letter for (2.17 prints them in octal), 0 when none: kept, not judged.
    """

    name: str
    kind: str  # MDT | OST
    index: int
    size_bytes: int | None
    avail_bytes: int | None
    files: int | None
    files_free: int | None
    active: bool = True
    flags: str = ""
    pools: tuple[str, ...] = ()
    in_layout: bool = True
    unknown_state: int = 0


#: The import states in which this node has a working connection to the target (lustre-release
#: v2_17_0, lustre/ptlrpc/import.c): FULL, and IDLE (closed on purpose after `idle_timeout`
#: without traffic, `ptlrpc_disconnect_and_idle_import`; the next request reconnects it).
CONNECTED_STATES = frozenset({"FULL", "IDLE"})
#: The states of a connection the server accepted while it recovers (`ptlrpc_connect_interpret`,
#: `ptlrpc_import_recovery_state_machine`): requests wait until it is FULL again.
RECOVERY_STATES = frozenset({"REPLAY", "REPLAY_LOCKS", "REPLAY_WAIT", "RECOVER"})
#: The longest an idle disconnect or reconnect stays CONNECTING: a connect attempt is given
#: at most `CONNECTION_SWITCH_MAX` (50 s, lustre/include/obd_support.h at v2_17_0) before it
#: fails to DISCONN.
IDLE_CONNECT_SECONDS = 50.0
#: The longest a target's recovery can last at the default `obd_timeout` (100 s):
#: `OBD_RECOVERY_TIME_HARD`, 9 x obd_timeout (the soft window is 3 x, 300 s).
RECOVERY_HARD_SECONDS = 900.0


@dataclass(frozen=True)
class LustreImport:
    """This node's connection (import) to one MDT or OST, as `lctl get_param *.state` shows it.

    `state` is the kernel's name (``FULL``, ``DISCONN``, ``EVICTED`` ...). `lost_at` is when the
    import left FULL/IDLE for the state it is in, when its 16-entry history still shows it
    (None while connected); `lost_before` is set instead when the history has forgotten it
    (the loss is older than its oldest entry). `last_eviction` is the latest EVICTED known.
    `active` is False for an OSC the admin deactivated (``osc.*.active=0``): no new file gets
    an object there. `idle_cycle` marks a CONNECTING that is the brief step of an idle
    disconnect or reconnect (straight from FULL or IDLE, no DISCONN, younger than
    `IDLE_CONNECT_SECONDS` when read). `in_layout` is False for an MDT that a new file in the
    target directory never meets (neither MDT0000 nor one of the directory's).
    """

    name: str  # FSNAME-OST0007
    kind: str  # MDT | OST
    index: int
    state: str
    lost_at: float | None = None
    last_eviction: float | None = None
    active: bool = True
    idle_cycle: bool = False
    lost_before: float | None = None
    in_layout: bool = True

    @property
    def connected(self) -> bool:
        """Whether this node has a working connection to the target, maybe still recovering."""
        return self.state in CONNECTED_STATES or self.idle_cycle or self.recovering

    @property
    def recovering(self) -> bool:
        """Connected again, and replaying or waiting for the target's recovery to end."""
        return self.state in RECOVERY_STATES


@dataclass(frozen=True)
class WriteProbeResult:
    """The atomic-save rehearsal: every step timed, the failing step and errno if any."""

    ok: bool
    bytes: int
    latency_seconds: Mapping[str, float]
    step: str | None = None
    errno: str | None = None
    message: str = ""

    @property
    def total_seconds(self) -> float:
        return self.latency_seconds.get("total", 0.0)


@dataclass(frozen=True)
class TmpdirInfo:
    """Whether a framework staging a checkpoint in $TMPDIR (Lightning's `TorchCheckpointIO`,
    through fsspec) can rename it into the target, and the room it has for one there."""

    path: str
    same_device: bool
    free_bytes: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """The latest result of every probe of one target, and the recent write-probe errors.

    ``recent_write_errors`` holds the errno names of the last few write probes, newest last
    (``None`` for a success), because one transient error in the last three probes still counts.
    """

    target: str
    results: Mapping[str, ProbeResult] = field(default_factory=dict)
    recent_write_errors: tuple[str | None, ...] = ()

    def get(self, probe: str) -> ProbeResult | None:
        return self.results.get(probe)

    def value(self, probe: str):
        """The value of the latest run of `probe`, or ``None`` when it failed or never ran."""
        result = self.results.get(probe)
        return result.value if result is not None and result.ok else None

    @property
    def probed_at(self) -> float | None:
        finished = [r.finished_at for r in self.results.values()]
        return max(finished) if finished else None


@dataclass(frozen=True)
class LastSave:
    """The latest real save the daemon heard of in a target (`fsprobe.events`): what the
    status shows. `uid` is the kernel's word for who saved; the rest is the saver's."""

    at: float  # Unix time the daemon heard of it
    outcome: str  # ok | retried | redirected | failed
    seconds: float
    bytes: int
    requested: str
    landed: str | None
    uid: int
    pid: int
    host: str
    ranks: int
    failures: tuple[tuple[str, str], ...]  # (errno, step) of each failed attempt


def binding_phrase(limited_by: str | None) -> str:
    """Where a limit binds, in words: ``on the filesystem``, ``under the user quota``."""
    if limited_by is None or limited_by == "filesystem":
        return "on the filesystem"
    kind, _, pool = limited_by.split(":", 1)[1].partition("@")
    return f"under the {kind} quota" + (f" of pool {pool}" if pool else "")


def full_errno(limited_by: str | None) -> str:
    """What a write gets when the binding limit runs out: a quota says EDQUOT, a disk ENOSPC."""
    return "EDQUOT" if limited_by is not None and limited_by.startswith("quota:") else "ENOSPC"


def fit_need(
    need: tuple[int | None, int | None],
    left: tuple[int | None, int | None],
    limited_by: tuple[str | None, str | None],
) -> tuple[bool | None, tuple[Reason, ...]]:
    """Whether a save needing (bytes, inodes) fits what is `left` of each under the limit
    that binds it; a save that does not is refused, unhealthy, with ENOSPC or EDQUOT. None:
    nothing was asked, or what is left is unknown. The one rule of `policy.evaluate` and of
    `SaveAnswer.fit`."""
    if need == (None, None):
        return None, ()
    refusals = []
    unknown = False
    for code, wanted, remaining, limit, fmt in (
        ("space_headroom_low", need[0], left[0], limited_by[0], format_bytes),
        ("inode_headroom_low", need[1], left[1], limited_by[1], format_count),
    ):
        if wanted is None:
            continue
        if remaining is None:
            unknown = True
        elif wanted > remaining:
            refusals.append(
                Reason(
                    code,
                    Severity.UNHEALTHY,
                    f"the checkpoint needs {fmt(wanted)} but only {fmt(remaining)} is left "
                    f"{binding_phrase(limit)}",
                    errno=full_errno(limit),
                )
            )
    if refusals:
        return False, tuple(refusals)
    return (None if unknown else True), ()


@dataclass(frozen=True)
class SaveAnswer:
    """What a save asks of the daemon about one target, and nothing more: worked out by the
    policy from its verdict (`policy.save_answer`) and written flat into the state file beside
    the report, so that a save reads it without the report or the judge (docs/reference.md).

    `can_take_save`: a save may be written here now; `worth_waiting`: trouble that is expected
    to pass stands in the way, none that stays; `acceptable_destination`: good enough to
    redirect a save to (judged, nothing in the way); `headroom_*`: what a new file can still
    take, None when unknown, and the limit that binds it; `exists`: whether the directory
    itself exists (None: not known); `errno`: what a write now would most likely fail with;
    `fresh_until`: when it stops holding without a new probe result; `reasons`: worst first.
    `fits` is set by `fit`, for one save's need; it is never written.
    """

    status: Status
    can_take_save: bool
    worth_waiting: bool
    acceptable_destination: bool
    headroom_bytes: int | None
    headroom_inodes: int | None
    bytes_limited_by: str | None
    inodes_limited_by: str | None
    exists: bool | None
    errno: str | None
    fresh_until: float | None
    reasons: tuple[Reason, ...]
    fits: bool | None = None

    def fit(self, need_bytes: int | None, need_inodes: int | None) -> SaveAnswer:
        """This answer for a save of this size (`fit_need`): one that does not fit is
        refused here, unhealthy, nor redirected here."""
        fits, refusals = fit_need(
            (need_bytes, need_inodes),
            (self.headroom_bytes, self.headroom_inodes),
            (self.bytes_limited_by, self.inodes_limited_by),
        )
        if not refusals:
            return self if fits == self.fits else dataclasses.replace(self, fits=fits)
        reasons = tuple(sorted((*refusals, *self.reasons), key=lambda r: -r.severity))
        return dataclasses.replace(
            self,
            status=max(self.status, Status.UNHEALTHY),
            can_take_save=False,
            worth_waiting=False,
            acceptable_destination=False,
            errno=refusals[0].errno,
            reasons=reasons,
            fits=False,
        )
