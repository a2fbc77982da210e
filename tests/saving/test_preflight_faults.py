"""`fsprobe.preflight` on a hung mount (FUSE fault filesystem with `statfs` blocked): it answers
within its deadline, costs one blocked thread however often it is asked, and waits for recovery
when told to."""

from __future__ import annotations

import os
import threading
import time

import fsprobe
from fsprobe.model import Status

TIMEOUT = 1.0
SLACK = 5.0  # generous: the machine is shared


def test_blocked_statfs_answers_within_the_deadline_with_mount_stuck(faultfs, tmp_path):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    rule = faultfs.ctl.block("statfs")
    threads_before = threading.active_count()

    start = time.monotonic()
    attempted = fsprobe.preflight(target / "model.pt", timeout=TIMEOUT)
    took = time.monotonic() - start
    assert took < TIMEOUT + SLACK
    assert attempted.action == "proceed" and attempted.status is Status.UNHEALTHY
    assert "mount_stuck" in [r.code for r in attempted.reasons]
    faultfs.ctl.wait_blocked(rule)

    start = time.monotonic()
    redirected = fsprobe.preflight(target / "other.pt", timeout=TIMEOUT, fallback_dirs=[fallback])
    assert time.monotonic() - start < TIMEOUT + SLACK
    assert redirected.action == "redirect"
    assert redirected.path == f"{fallback}/uid-{os.geteuid()}{target / 'other.pt'}"
    assert "mount_stuck" in [r.code for r in redirected.reasons]

    for _ in range(5):  # a hung mount stays one blocked worker, not one per call
        fsprobe.preflight(target / "model.pt", timeout=TIMEOUT)
    assert threading.active_count() - threads_before <= 2  # statvfs, and tmpdir behind it
    assert faultfs.ctl.rule(rule)["waiting"] == 1


def test_with_max_wait_it_waits_for_the_mount_to_come_back(faultfs):
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    rule = faultfs.ctl.block("statfs")
    release = threading.Timer(2.5, faultfs.ctl.remove, args=(rule,))
    release.start()
    try:
        start = time.monotonic()
        decision = fsprobe.preflight(target / "model.pt", max_wait=20, timeout=TIMEOUT)
        took = time.monotonic() - start
    finally:
        release.cancel()
    assert decision.action == "delay" and decision.concerns == ()  # recovered
    assert decision.path == str(target / "model.pt")
    assert 1.0 < decision.wait_seconds < 20
    assert took < TIMEOUT + 20 + SLACK


def test_max_wait_is_a_bound_when_the_mount_stays_hung(faultfs):
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    faultfs.ctl.block("statfs")
    start = time.monotonic()
    decision = fsprobe.preflight(target / "model.pt", max_wait=2.0, timeout=TIMEOUT)
    took = time.monotonic() - start
    assert decision.action == "delay" and decision.status is Status.UNHEALTHY
    assert "mount_stuck" in [r.code for r in decision.reasons]
    assert decision.wait_seconds >= 2.0 and took < TIMEOUT + 2.0 + SLACK
    assert os.path.basename(decision.path) == "model.pt"
