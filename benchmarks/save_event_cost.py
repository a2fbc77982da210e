"""What reporting a save event costs the save (issue 21): nothing measurable, daemon or not.

The same small durable save (`fsprobe.atomic_write`, fsync and all, into a directory on this
machine) is timed, interleaved round by round, with the event sent as it ships and with the
report replaced by a no-op (the save as it was before events existed), in three worlds: no
daemon (no state dir), a daemon that died (its socket file left behind: ECONNREFUSED), and a
daemon that hangs (its socket never read: the queue fills, then every send is EAGAIN). Also
the bare `send()` of its datagram in each world. Prints medians and the ratio to the no-op.

    .venv/bin/python benchmarks/save_event_cost.py [--rounds 300] [--size 64K]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import fsprobe
import fsprobe.saving.retry as retry
from fsprobe.events.emit import SOCKET_NAME, send
from fsprobe.events.event import SaveEvent
from fsprobe.units import format_bytes, parse_size


@contextlib.contextmanager
def world(kind: str, home: Path) -> Iterator[str]:
    """A state dir as the save sees it with no daemon, a dead one, or a hung one."""
    state_dir = home / kind
    if kind == "no daemon":
        yield str(state_dir)  # does not exist
        return
    state_dir.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(state_dir / SOCKET_NAME))
    if kind == "dead daemon":
        sock.close()
        yield str(state_dir)
        return
    with sock:  # hung: bound, never read
        yield str(state_dir)


def no_send(datagram: bytes, state_dir: str | None = None) -> bool:
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--size", default="64K")
    args = parser.parse_args()
    payload = os.urandom(parse_size(args.size))
    with tempfile.TemporaryDirectory(prefix="fsprobe-event-cost-") as scratch:
        home = Path(scratch)
        target = home / "ckpt"
        target.mkdir()
        print(f"{args.rounds} rounds of a {format_bytes(len(payload))} atomic_write, medians")
        print(f"{'world':<12} {'no-op':>9} {'report':>9} {'paired':>6} {'report() alone':>15}")
        for kind in ("no daemon", "dead daemon", "hung daemon"):
            with world(kind, home) as state_dir:
                times: dict[str, list[float]] = {"no-op": [], "report": []}
                for number in range(args.rounds):  # ABBA: neither goes first every time
                    for mode in ("no-op", "report") if number % 2 else ("report", "no-op"):
                        retry.send = no_send if mode == "no-op" else send
                        start = time.perf_counter()
                        fsprobe.atomic_write(
                            target / "model.pt", lambda f: f.write(payload), state_dir=state_dir
                        )
                        times[mode].append(time.perf_counter() - start)
                retry.send = send
                event = SaveEvent("/c/m.pt", "/c/m.pt", 1, 0.1, 1, (), time.time(), "h", 1)
                alone = []
                for _ in range(1000):
                    start = time.perf_counter()
                    send(event.encode(), state_dir)
                    alone.append(time.perf_counter() - start)
            off, on = statistics.median(times["no-op"]), statistics.median(times["report"])
            paired = statistics.median(a / b for a, b in zip(times["report"], times["no-op"]))
            print(
                f"{kind:<12} {off * 1e3:>7.2f}ms {on * 1e3:>7.2f}ms {paired:>6.3f} "
                f"{statistics.median(alone) * 1e6:>12.1f} µs"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
