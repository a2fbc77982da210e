"""The processes that save into a target, as their save events name them, and which still live.

Gone when ``/proc/<pid>`` is, or holds another process; a sender outside our pid namespace
(pid 0) until its goodbye or a long silence (docs/design.md §13).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

#: Saving processes remembered per target; beyond, the one heard from longest ago of the uid
#: with the most is forgotten (a user crowds out only her own).
MAX_SAVERS = 256
#: How often (seconds) the daemon looks whether the saving processes still live.
CHECK_EVERY = 1.0
#: A saver the daemon cannot look up (outside its pid namespace: the kernel gave pid 0) is
#: forgotten once silent for this many of its target's save intervals ...
SILENT_INTERVALS = 10.0
#: ... or, while no interval is known (no overdue alert to keep), for this long (seconds).
SILENT_UNTIMED = 86400.0

#: `started(pid)`: the start time of process `pid` (None: no such process).
StartTime = Callable[[int], "int | None"]


def process_start(pid: int, proc: str = "/proc") -> int | None:
    """The start time of `pid` in clock ticks after boot (field 22 of ``/proc/<pid>/stat``),
    None if there is no such process."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as stream:
            text = stream.read(4096)
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()  # after the command, which may hold spaces
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


Key = TypeVar("Key")


def crowding(owned: list[tuple[Key, int]]) -> Key:
    """Of entries `owned` (key, uid; oldest first) that are too many, the key to forget: the
    oldest of the uid that has the most, so that no user's claims push out another user's."""
    most = Counter(uid for _, uid in owned).most_common(1)[0][0]
    return next(key for key, uid in owned if uid == most)


@dataclass(frozen=True)
class Saver:
    """A process that reported a save: its uid (the kernel's), its host and pid, when it can
    be looked up here its start time, and when its latest save was heard of."""

    uid: int
    host: str
    pid: int
    started: int | None
    heard_at: float


class Savers:
    """The live saving processes of one target, by (uid, host, pid): the kernel's uid is part
    of the key, so no user's claim of a host and pid ever stands for another user's process."""

    def __init__(self) -> None:
        self._savers: OrderedDict[tuple[int, str, int], Saver] = OrderedDict()

    def __len__(self) -> int:
        return len(self._savers)

    def __iter__(self) -> Iterator[Saver]:
        """Heard from longest ago first."""
        return iter(list(self._savers.values()))

    def heard(self, saver: Saver) -> None:
        key = (saver.uid, saver.host, saver.pid)
        self._savers.pop(key, None)
        self._savers[key] = saver
        if len(self._savers) > MAX_SAVERS:
            del self._savers[crowding([(k, k[0]) for k in self._savers])]

    def goodbye(self, host: str, pid: int, uid: int) -> bool:
        """Forget the process that says goodbye (its own uid's claim; root's ends any);
        whether it was one of ours."""
        gone = [k for k in self._savers if k[1:] == (host, pid) and uid in (k[0], 0)]
        for key in gone:
            del self._savers[key]
        return bool(gone)

    def forget_gone(self, started: StartTime, now: float, silent: float) -> bool:
        """Forget the processes that are gone, and those that cannot be looked up and were
        silent for longer than `silent` seconds (killed or not, their end cannot be seen);
        whether any was."""
        gone = [
            key
            for key, saver in self._savers.items()
            if (
                now - saver.heard_at > silent
                if saver.started is None
                else started(saver.pid) != saver.started
            )
        ]
        for key in gone:
            del self._savers[key]
        return bool(gone)
