"""Root's sync of 10 users' areas while one user stops or slows her run: what it costs the others.

Issue 18.3: one user's area costs at most a bounded share of a sync round. Ten real accounts
(useradd for the run, removed after) each have a checkpoint redirected to one scratch fallback,
their targets ready to take it back. Root's ``fsprobe sync --round-timeout R`` is timed:

- ``baseline``: the 9 other users alone (her area absent);
- ``stopped``: all 10, while the user with the lowest uid (she goes first) SIGSTOPs her run as
  soon as it appears (it is seen stopped, killed, and reported);
- ``slow``: all 10, while she holds the lock of her own manifest, which her run waits for (30 s
  past the copy): it is killed at her share, R / 10.

    sudo .venv/bin/python benchmarks/sync_share.py --round-timeout 60

Goal: each round with her at most her share plus the others' own time (the baseline's), and
the other 9 users synced in it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.attacks.test_attack_delegation import HOLD_LOCK, MEDDLE
from tests.redirect.test_trust_fallback import make_dir, save_as
from tests.support.users import REPO, LocalUsers, SharedPython, share

USERS = 10


def prepare(place: Path, users: list) -> Path:
    """A fresh scratch fallback with one redirected checkpoint of each of `users`."""
    scratch = make_dir(place / "scratch", 0o1777)
    for user in users:
        target = make_dir(place / f"{user.name}-ckpt", 0o755)  # root's: the save is redirected
        assert save_as(user, target / "model.pt", f"{user.name}'s", scratch)["redirected"]
        os.chown(target, user.uid, -1)  # now it can take the checkpoint back
    return scratch


def timed_sync(python: str, scratch: Path, round_timeout: float) -> tuple[float, dict, int]:
    started = time.monotonic()
    done = subprocess.run(
        [python, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(scratch),
         "--round-timeout", str(round_timeout)],
        cwd=REPO, capture_output=True, text=True, timeout=3 * round_timeout + 120, check=False,
    )  # fmt: skip
    return time.monotonic() - started, json.loads(done.stdout), done.returncode


def scenario(
    name: str, users: LocalUsers, accounts: list, her, round_timeout: float
) -> tuple[float, int, int]:
    """(seconds, users synced, failures) of one round."""
    place = Path(tempfile.mkdtemp(prefix=f"fsprobe-sync-share-{name}-"))
    share(place)
    others = [user for user in accounts if user is not her]
    scratch = prepare(place, others if name == "baseline" else accounts)
    meddler = None
    if name == "stopped":
        meddler = subprocess.Popen(
            [users.python, "-c", MEDDLE, "stop"], stdout=subprocess.PIPE, text=True,
            **her.subprocess_kwargs(),
        )  # fmt: skip
        time.sleep(0.5)
    elif name == "slow":
        manifest = scratch / f"uid-{her.uid}" / ".fsprobe-redirects.jsonl"
        meddler = subprocess.Popen(
            [users.python, "-c", HOLD_LOCK, str(manifest)], stdout=subprocess.PIPE, text=True,
            **her.subprocess_kwargs(),
        )  # fmt: skip
        assert meddler.stdout.readline() == "locked\n"
    try:
        took, report, status = timed_sync(users.python, scratch, round_timeout)
    finally:
        if meddler is not None:
            meddler.kill()
            meddler.wait()
    synced = sum(entry["action"] == "synced" for entry in report["entries"])
    print(f"{name:>9}: {took:6.1f} s, {synced} synced, failures {len(report['failures'])}, "
          f"exit {status}", flush=True)  # fmt: skip
    return took, synced, len(report["failures"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-timeout", type=float, default=60.0)
    options = parser.parse_args()
    shared = SharedPython()
    users = LocalUsers(python=shared.executable)
    try:
        accounts = sorted((users.user() for _ in range(USERS)), key=lambda user: user.uid)
        her = accounts[0]  # the lowest uid: root's sync starts with her
        results = {
            name: scenario(name, users, accounts, her, options.round_timeout)
            for name in ("baseline", "stopped", "slow")
        }
    finally:
        problems = users.remove()
        shared.close()
        if problems:
            print("removing the users:", problems)
    base = results["baseline"][0]
    her_share = options.round_timeout / USERS
    for name in ("stopped", "slow"):
        took = results[name][0]
        print(
            f"{name}: {took / base:.2f}x the baseline ({base:.1f} s); her share {her_share:.1f} s;"
            f" share + baseline {her_share + base:.1f} s: "
            f"{'within' if took <= her_share + base else 'OVER'}"
        )


if __name__ == "__main__":
    main()
