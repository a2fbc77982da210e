"""Client of the fault filesystem's control socket (protocol in :mod:`tests.support.faultfs`).

Each call opens its own short connection, so one client may be shared by threads and outlives
a restarted filesystem. Typical use in a test::

    rule = fs.ctl.fail("write", "EIO", path="*.tmp")      # the next write to a *.tmp fails
    fs.ctl.set_quota("inodes", hard=100)                     # EDQUOT past 100 inodes
    rule = fs.ctl.block("statfs"); ...; fs.ctl.remove(rule)  # a hung mount, then released
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

#: Marks a keyword of :meth:`FaultControl.set_quota` that was not given (``None`` lifts).
_UNCHANGED: Any = object()


class FaultControlError(RuntimeError):
    """The filesystem refused a request (bad arguments) or could not be reached."""


class FaultControl:
    """Drive a running fault filesystem: rules, quota, statfs numbers, counters."""

    def __init__(self, socket_path: str, timeout: float = 10.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout = timeout

    def request(self, cmd: str, **args: Any) -> Any:
        """Send one command and return its result; raise FaultControlError on refusal."""
        line = json.dumps({"cmd": cmd, **args}).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
                sock.sendall(line)
                with sock.makefile("rb") as replies:
                    raw = replies.readline()
        except OSError as exc:
            raise FaultControlError(f"faultfs control {self.socket_path}: {exc}") from exc
        if not raw:
            raise FaultControlError(f"faultfs control {self.socket_path}: connection closed")
        reply = json.loads(raw)
        if not reply["ok"]:
            raise FaultControlError(f"faultfs {cmd}: {reply['error']}")
        return reply["result"]

    # -- faults ------------------------------------------------------------------------------

    def fail(
        self,
        op: str,
        errno: int | str,
        *,
        path: str | None = None,
        after: int = 0,
        times: int | None = 1,
        sticky: bool = False,
    ) -> int:
        """Fail calls of `op` with `errno`: skip `after` matching calls, fail the next `times`.

        ``fail("write", "EIO", after=2)`` fails the 3rd write, ``times=None`` every write.
        Returns the rule id.
        """
        return self.request(
            "fail", op=op, errno=errno, path=path, after=after, times=times, sticky=sticky
        )["id"]

    def delay(
        self,
        op: str,
        seconds: float,
        *,
        path: str | None = None,
        after: int = 0,
        times: int | None = None,
    ) -> int:
        """Hold each matching call of `op` for `seconds` (all of them unless `times`).

        Also the way to hang a call that a test must then wait out: a blocked call keeps its
        process from exiting until the rule is removed, a delayed one ends by itself.
        """
        return self.request("delay", op=op, seconds=seconds, path=path, after=after, times=times)[
            "id"
        ]

    def block(
        self, op: str, *, path: str | None = None, after: int = 0, times: int | None = None
    ) -> int:
        """Hold matching calls of `op` until the rule is removed (``block("*")``: a hung mount).

        The held thread sleeps uninterruptibly, as on a hung NFS mount: its process cannot
        exit (nor close its pipes) before :meth:`remove`. See :mod:`tests.support.faults`.
        """
        return self.request("block", op=op, path=path, after=after, times=times)["id"]

    def remove(self, rule_id: int) -> None:
        """Remove a rule; calls blocked on it go on."""
        self.request("remove", id=rule_id)

    def clear(self) -> None:
        """Remove every rule; every blocked call goes on."""
        self.request("clear")

    def rules(self) -> list[dict[str, Any]]:
        return self.request("rules")

    def rule(self, rule_id: int) -> dict[str, Any]:
        """One rule's state: ``seen`` (matching calls), ``hits`` (acted on), ``waiting``."""
        for rule in self.rules():
            if rule["id"] == rule_id:
                return rule
        raise FaultControlError(f"no rule with id {rule_id}")

    def wait_blocked(self, rule_id: int, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until `count` calls are held by block or delay rule `rule_id`, or TimeoutError."""
        deadline = time.monotonic() + timeout
        while self.rule(rule_id)["waiting"] < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"fewer than {count} calls blocked on rule {rule_id}")
            time.sleep(0.01)

    def set_readonly(self, readonly: bool = True) -> None:
        """Make every mutating call fail with EROFS (statvfs still shows the mount writable)."""
        self.request("set_readonly", readonly=readonly)

    # -- counters ----------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Calls seen per operation since start or the last reset, failed ones included."""
        return self.request("counts")

    def reset_counts(self) -> None:
        self.request("reset_counts")

    def journal(self) -> dict[str, Any]:
        """The changing and syncing calls in order: ``{"entries": [[op, paths, error]...],
        "dropped": n}`` (:mod:`tests.support.journal`; :mod:`tests.support.durability`
        reads it)."""
        return self.request("journal")

    def clear_journal(self) -> None:
        self.request("clear_journal")

    # -- quota -------------------------------------------------------------------------------

    def quota(self) -> dict[str, Any]:
        """Usage, limits and grace state (shape in the faultfs module docstring)."""
        return self.request("quota")

    def set_quota(
        self,
        resource: str,
        *,
        soft: int | None = _UNCHANGED,
        hard: int | None = _UNCHANGED,
        grace: float = _UNCHANGED,
    ) -> dict[str, Any]:
        """Change limits of ``"bytes"`` or ``"inodes"``; keywords not given stay, ``None`` lifts."""
        given = {
            k: v
            for k, v in (("soft", soft), ("hard", hard), ("grace", grace))
            if v is not _UNCHANGED
        }
        return self.request("set_quota", resource=resource, **given)

    def lift_quota(self) -> None:
        """Remove every limit (usage keeps being counted)."""
        for resource in ("bytes", "inodes"):
            self.set_quota(resource, soft=None, hard=None)

    def exempt_root(self, exempt: bool = True) -> None:
        """Let root's calls (fsuid 0) past the quota, as Lustre does; others are still refused."""
        self.request("exempt_root", exempt=exempt)

    def rescan(self) -> dict[str, Any]:
        """Recount usage from the backing tree (after changing it behind the mount's back)."""
        return self.request("rescan")

    # -- statfs ------------------------------------------------------------------------------

    def set_statfs(self, **fields: int) -> None:
        """Report these statvfs numbers (``f_blocks=..., f_bavail=..., f_ffree=...``); the
        fields not given pass through from the backing filesystem, and no fields at all
        restore plain passthrough."""
        self.request("set_statfs", fields=fields)

    def statfs(self) -> dict[str, int]:
        """The numbers statfs would report now, without counting or blocking a call."""
        return self.request("statfs")

    # -- lifecycle ---------------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        return self.request("ping")

    def shutdown(self) -> None:
        """Release every blocked call for good (teardown calls this before unmounting)."""
        self.request("shutdown")
