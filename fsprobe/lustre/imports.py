"""This node's connection to each MDT and OST: the import states `lctl get_param` prints.

One run reads every mount's imports; the target's mount is told by its filesystem name and, where
the node has several mounts of it, by the instance `lfs getname` prints.

The forms (docs/lfs-output-formats.md §5) are those of the kernel's `lprocfs_state_seq_show` and
`lctl`'s `print_param_internal` at v2_17_0; reading them sends no RPC.
"""

from __future__ import annotations

import os
import re
import shlex

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.runner import run_lfs, status_error_name
from fsprobe.model import CONNECTED_STATES, LustreImport
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
_CURRENT = re.compile(r"^current_state: (\S+)$")
_HISTORY = re.compile(r"^ - \[ ([0-9]+), (\S+) \]$")


def lctl_binary(explicit: str | None = None) -> str:
    """The binary to run: `explicit` (--lctl / config), else $FSPROBE_LCTL, else ``lctl``."""
    return explicit or os.environ.get(ENV_LCTL) or "lctl"


def _target(match: re.Match[str], current: str, history: list[tuple[int, str]]) -> LustreImport:
    device, fsname, kind, index, _instance = match.groups()
    if (device, kind) not in (("osc", "OST"), ("mdc", "MDT")):
        raise ProbeFailure(PARSE, f"lctl named {match.group(0)!r}: not a client's device")
    evictions = [at for at, state in history if state == "EVICTED"]
    last_up = max(
        (i for i, (_, state) in enumerate(history) if state in CONNECTED_STATES), default=-1
    )
    down = history[last_up + 1 :]
    lost_at = down[0][0] if down and current not in CONNECTED_STATES else None
    return LustreImport(
        name=f"{fsname}-{kind}{index}",
        kind=kind,
        index=int(index, 16),
        state=current,
        lost_at=float(lost_at) if lost_at is not None else None,
        last_eviction=float(evictions[-1]) if evictions else None,
    )


Mounts = dict[tuple[str, str], tuple[LustreImport, ...]]


def parse_states(stdout: str) -> Mounts:
    """Every import in what `lctl get_param` printed, by (fsname, instance) of its mount.

    Each parameter is ``NAME.state=`` on a line of its own, then ``current_state: STATE``,
    ``state_history:`` and up to 16 `` - [ <unix time>, <STATE> ]`` lines (oldest first).
    ProbeFailure(PARSE) for any line that is none of these. A server's own imports (instance
    ``MDT0000``) are read but belong to no mount.
    """
    found: dict[tuple[str, str], list[LustreImport]] = {}
    param: re.Match[str] | None = None
    current: str | None = None
    history: list[tuple[int, str]] = []
    count = 0

    def finish() -> None:
        if param is not None:
            if current is None:
                raise ProbeFailure(PARSE, f"lctl printed no current_state for {param.group(0)!r}")
            if _SERVER_INSTANCE.match(param.group(5)):
                return
            mount = (param.group(2), param.group(5))
            found.setdefault(mount, []).append(_target(param, current, history))

    for number, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        # One rule per line, told by how it starts: most lines are history entries.
        entry = _HISTORY.match(line) if line.startswith(" - [") else None
        state = _CURRENT.match(line) if entry is None and line.startswith("current_") else None
        header = _PARAM.match(line) if line.endswith(".state=") else None
        if header is not None:
            finish()
            param, current, history = header, None, []
            count += 1
        elif param is not None and state is not None and current is None:
            current = state.group(1)
        elif param is not None and current is not None and line == "state_history:":
            continue
        elif param is not None and current is not None and entry is not None:
            history.append((int(entry.group(1)), entry.group(2)))
        else:
            raise ProbeFailure(PARSE, f"cannot read lctl's line {number}: {line.strip()[:200]!r}")
        if count > MAX_TARGETS or len(history) > 64:
            raise ProbeFailure(PARSE, "lctl printed more than any import holds")
        if current is not None and current not in STATES:
            raise ProbeFailure(PARSE, f"lctl printed an unknown import state {current!r}")
    finish()
    return {
        mount: tuple(sorted(imports, key=lambda t: (t.kind, t.index)))
        for mount, imports in found.items()
    }


def read_states(lctl: str, deadline: Deadline) -> Mounts:
    """Run ``lctl get_param osc.*.state mdc.*.state`` and read every mount's imports."""
    args = ("get_param", "osc.*.state", "mdc.*.state")
    run = run_lfs(args, binary=lctl, timeout=deadline.remaining(), how_to_fix=_HOW_TO_FIX)
    if run.status != 0:
        said = (run.stderr.strip() or "no message")[:500]
        raise ProbeFailure(status_error_name(run.status), f"{shlex.join(run.argv)}: {said}")
    return parse_states(run.stdout)


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
    if not imports:
        which = f"{fsname}-{instance}" if instance else (fsname or "the mount")
        raise ProbeFailure("ENODEV", f"lctl shows no MDT or OST of {which}")
    return imports
