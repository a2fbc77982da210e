"""This node's connection to each MDT and OST: the import states `lctl get_param` prints.

One run reads every mount's imports; the target's mount is told by its filesystem name and, where
the node has several mounts of it, by the instance `lfs getname` prints.

The forms (docs/lfs-output-formats.md §5) are those of the kernel's `lprocfs_state_seq_show` and
`lctl`'s `print_param_internal` at v2_17_0; reading them sends no RPC.
"""

from __future__ import annotations

import os
import re

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.lctl import Unread, get_params
from fsprobe.model import CONNECTED_STATES, IDLE_CONNECT_SECONDS, LustreImport
from fsprobe.quota.provider import Deadline

#: Environment variable naming the `lctl` binary when no --lctl/config value is given.
ENV_LCTL = "FSPROBE_LCTL"
#: The names `ptlrpc_import_state_name` prints (lustre/include/lustre_import.h).
STATES = frozenset(
    {
        "CLOSED",
        "NEW",
        "DISCONN",
        "CONNECTING",
        "REPLAY",
        "REPLAY_LOCKS",
        "REPLAY_WAIT",
        "RECOVER",
        "FULL",
        "EVICTED",
        "IDLE",
        "<UNKNOWN>",
    }
)
#: What is read: whether each OSC is active, then every import's state (lctl's exit status
#: is not the answer: `fsprobe.lustre.lctl` reads which parameter failed from stderr).
PATTERNS = ("osc.*.active", "osc.*.state", "mdc.*.state")
#: The entries of an import's state history (`IMP_STATE_HIST_LEN`, lustre/include/lustre_import.h).
HISTORY_LENGTH = 16
#: At most this many targets are read: a file system with more is beyond any in the field.
MAX_TARGETS = 65536

_HOW_TO_FIX = (
    "install the Lustre client tools, or name the binary with --lctl BIN, "
    f"the {ENV_LCTL} environment variable or `lctl` in the configuration"
)
_PARAM = re.compile(
    r"^(osc|mdc)\.([A-Za-z0-9_-]{1,8})-(OST|MDT)([0-9a-f]{4})-(?:osc|mdc)-(\S+)\.state=$"
)
#: The instance of a server's own connection (an MDT's OSP device `FSNAME-OST0000-osc-MDT0000`,
#: listed under `osc.*` on a node that serves an MDT): no mount of this node's.
_SERVER_INSTANCE = re.compile(r"^(?:MDT|OST)[0-9a-f]{4}$")
_ACTIVE = re.compile(r"^osc\.([A-Za-z0-9_-]{1,8})-OST([0-9a-f]{4})-osc-(\S+)\.active=([01])$")
#: A client device lctl names in an error: FSNAME-OST0007-osc-INSTANCE.
_DEVICE = re.compile(r"^([A-Za-z0-9_-]{1,8})-(OST|MDT)([0-9a-f]{4})-(?:osc|mdc)-(\S+)$")
_CURRENT = re.compile(r"^current_state: (\S+)$")
_HISTORY = re.compile(r"^ - \[ ([0-9]+), (\S+) \]$")


def lctl_binary(explicit: str | None = None) -> str:
    """The binary to run: `explicit` (--lctl / config), else $FSPROBE_LCTL, else ``lctl``."""
    return explicit or os.environ.get(ENV_LCTL) or "lctl"


def _target(
    match: re.Match[str],
    current: str,
    history: list[tuple[int, str]],
    active: bool,
    read_at: float,
) -> LustreImport:
    device, fsname, kind, index, _instance = match.groups()
    if (device, kind) not in (("osc", "OST"), ("mdc", "MDT")):
        raise ProbeFailure(PARSE, f"lctl named {match.group(0)!r}: not a client's device")
    evictions = [at for at, state in history if state == "EVICTED"]
    last_up = max(
        (i for i, (_, state) in enumerate(history) if state in CONNECTED_STATES), default=-1
    )
    down = history[last_up + 1 :]
    lost_at = lost_before = None
    if current not in CONNECTED_STATES and down:
        if last_up >= 0 or len(history) < HISTORY_LENGTH:
            lost_at = float(down[0][0])
        else:  # the ring has forgotten when it left FULL/IDLE
            lost_before = float(down[0][0])
    idle_cycle = (
        current == "CONNECTING"
        and last_up >= 0
        and all(state in ("CONNECTING", "NEW") for _, state in down)
        and lost_at is not None
        and read_at - lost_at <= IDLE_CONNECT_SECONDS
    )
    return LustreImport(
        name=f"{fsname}-{kind}{index}",
        kind=kind,
        index=int(index, 16),
        state=current,
        lost_at=None if idle_cycle else lost_at,
        last_eviction=float(evictions[-1]) if evictions else None,
        active=active,
        idle_cycle=idle_cycle,
        lost_before=lost_before,
    )


Mounts = dict[tuple[str, str], "tuple[LustreImport, ...] | ProbeFailure"]


def parse_states(stdout: str, read_at: float) -> Mounts:
    """Every import in what `lctl get_param` printed at `read_at`, by (fsname, instance) of its
    mount.

    Each state parameter is ``NAME.state=`` on a line of its own, then ``current_state:
    STATE``, ``state_history:`` and up to 16 `` - [ <unix time>, <STATE> ]`` lines (oldest
    first); each ``osc.NAME.active=0|1`` is one line. ProbeFailure(PARSE) for any line that is
    none of these. A server's own imports (instance ``MDT0000``) are read but belong to no
    mount.
    """
    read: list[tuple[re.Match[str], str, list[tuple[int, str]]]] = []
    inactive: set[tuple[str, str, str]] = set()  # (fsname, index, instance)
    param: re.Match[str] | None = None
    current: str | None = None
    history: list[tuple[int, str]] = []
    count = 0

    def finish() -> None:
        if param is not None:
            if current is None:
                raise ProbeFailure(PARSE, f"lctl printed no current_state for {param.group(0)!r}")
            read.append((param, current, history))

    for number, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        # One rule per line, told by how it starts: most lines are history entries.
        entry = _HISTORY.match(line) if line.startswith(" - [") else None
        state = _CURRENT.match(line) if entry is None and line.startswith("current_") else None
        header = _PARAM.match(line) if line.endswith(".state=") else None
        flag = _ACTIVE.match(line) if line.startswith("osc.") and header is None else None
        if header is not None:
            finish()
            param, current, history = header, None, []
            count += 1
        elif flag is not None:
            finish()
            param, current, history = None, None, []
            count += 1
            if flag.group(4) == "0":
                inactive.add((flag.group(1), flag.group(2), flag.group(3)))
        elif param is not None and state is not None and current is None:
            current = state.group(1)
        elif param is not None and current is not None and line == "state_history:":
            continue
        elif param is not None and current is not None and entry is not None:
            history.append((int(entry.group(1)), entry.group(2)))
        else:
            raise ProbeFailure(PARSE, f"cannot read lctl's line {number}: {line.strip()[:200]!r}")
        if count > 2 * MAX_TARGETS or len(history) > 64:
            raise ProbeFailure(PARSE, "lctl printed more than any import holds")
        if current is not None and current not in STATES:
            raise ProbeFailure(PARSE, f"lctl printed an unknown import state {current!r}")
    finish()
    found: dict[tuple[str, str], list[LustreImport]] = {}
    for match, state_name, entries in read:
        _device, fsname, _kind, index, instance = match.groups()
        if _SERVER_INSTANCE.match(instance):
            continue
        active = (fsname, index, instance) not in inactive
        target = _target(match, state_name, entries, active, read_at)
        found.setdefault((fsname, instance), []).append(target)
    return {
        mount: tuple(sorted(imports, key=lambda t: (t.kind, t.index)))
        for mount, imports in found.items()
    }


def read_states(lctl: str, deadline: Deadline) -> Mounts:
    """Run ``lctl get_param osc.*.active osc.*.state mdc.*.state`` and read every mount's
    imports.

    A mount with a parameter lctl could not read maps to a ProbeFailure naming it (its imports
    cannot all be judged); the other mounts are read, whatever lctl's exit status.
    """
    params = get_params(lctl, PATTERNS, deadline, _HOW_TO_FIX)
    mounts: Mounts = dict(parse_states(params.stdout, params.read_at))
    unreadable: dict[tuple[str, str], list[Unread]] = {}
    for unread in params.unread:
        device = _DEVICE.match(unread.device)
        if device is None or _SERVER_INSTANCE.match(device.group(4)):
            continue  # a server's own connection: no mount of this node's
        unreadable.setdefault((device.group(1), device.group(4)), []).append(unread)
    for mount, unreads in unreadable.items():
        said = ", ".join(
            f"{u.device.rsplit('-', 2)[0]}'s {u.name.rsplit('.', 1)[1]} ({u.message})"
            for u in unreads
        )
        mounts[mount] = ProbeFailure(unreads[0].error, f"lctl could not read {said}")
    return mounts


def own_mount(mounts: Mounts, fsname: str | None, instance: str | None) -> tuple[LustreImport, ...]:
    """The imports of the mount (`fsname`, `instance`); with the instance unknown, those of the
    one mount of `fsname` (of the one mount, with that unknown too). ProbeFailure(ENODEV)
    when there is none, ValueError when it takes `lfs getname` to tell."""
    if instance is not None and fsname is not None:
        imports = mounts.get((fsname, instance))
    else:
        candidates = [key for key in mounts if fsname is None or key[0] == fsname]
        if len(candidates) > 1:
            raise ValueError("several mounts: their instance tells them apart")
        imports = mounts[candidates[0]] if candidates else None
    if isinstance(imports, ProbeFailure):
        raise imports
    if not imports:
        which = f"{fsname}-{instance}" if instance else (fsname or "the mount")
        raise ProbeFailure("ENODEV", f"lctl shows no MDT or OST of {which}")
    return imports
