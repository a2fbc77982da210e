"""`fsprobe run` with a bug planted, for the supervision tests (issue 17.2).

    python -m tests.support.sabotage judge PATH run ARGS...   the policy raises for PATH
    python -m tests.support.sabotage loop PATH run ARGS...    the scheduler's own loop raises
                                                              once PATH has a result

A bug cannot be asked for through any option of fsprobe's (nor should it be), so this runs
the real command in a process of its own with one function of the package replaced. The
bug fires only for PATH, so that the test sees what it does to the other targets.
"""

from __future__ import annotations

import sys

from fsprobe.cli import main
from fsprobe.daemon import scheduler, store


def plant_in_the_policy(path: str) -> None:
    """Judging PATH raises (as the policy did for a filesystem of zero size, issue 17.1)."""
    evaluate = store.evaluate

    def broken(snapshot, *args, **kwargs):
        if snapshot.target == path and snapshot.results:
            raise ZeroDivisionError("planted: judging this target divides by zero")
        return evaluate(snapshot, *args, **kwargs)

    store.evaluate = broken


def plant_in_the_loop(path: str) -> None:
    """The scheduler's own step (outside any one target's handling) raises once PATH has
    a probe result: the loop itself dies."""
    dispatch = scheduler.Scheduler._dispatch

    def broken(self, now, changed):
        view = self.store.view(path)
        if view is not None and view.snapshot.results:
            raise RuntimeError("planted: the scheduler's dispatch step failed")
        dispatch(self, now, changed)

    scheduler.Scheduler._dispatch = broken


if __name__ == "__main__":
    where, path, *command = sys.argv[1:]
    {"judge": plant_in_the_policy, "loop": plant_in_the_loop}[where](path)
    main(command, prog_name="fsprobe")
