"""The metrics endpoint, attacked by anyone who can reach its port (issue 13: spot checks).

The server's bounds (connections, deadlines, header sizes, slow clients) are held by
tests/test_exporter_bounds.py; these are the attacks that found a way around them.
"""

from __future__ import annotations

import threading
import time

import bcrypt

from tests.daemon_process import DaemonProcess, clean_environment
from tests.test_exporter_web import basic

#: A realistic bcrypt cost: Prometheus' docs suggest 10 or more; `htpasswd -B` makes 5..17.
ROUNDS = 12
GUESSES = 16


def test_wrong_passwords_do_not_queue_the_scraper_that_knows_the_right_one(tmp_path):
    """Every basic-auth check went through the two bcrypt threads, also those of credentials
    that had passed before and are answered from memory: a burst of wrong guesses (a bcrypt
    each, 0.2-0.3 s) queued Prometheus' own scrape behind all of them, and a few hundred held
    it past its deadline."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=ROUNDS)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    env = clean_environment(TMPDIR=str(ckpt))
    with DaemonProcess(tmp_path, str(ckpt), "--web-config", str(web), env=env) as daemon:
        assert daemon.get(headers=basic("prometheus", "s3cret"))[0] == 200  # now remembered
        answered: list[int] = []

        def guess(number: int) -> None:
            try:
                status, _ = daemon.get(headers=basic("prometheus", f"guess-{number}"), timeout=120)
            except OSError:  # cut at the server's request deadline (10 s) while queued
                status = 0
            answered.append(status)

        guessers = [threading.Thread(target=guess, args=(n,)) for n in range(GUESSES)]
        for guesser in guessers:
            guesser.start()
        time.sleep(1.0)  # every guess is in, waiting for a bcrypt thread
        before = len(answered)
        status, body = daemon.get(headers=basic("prometheus", "s3cret"), timeout=120)
        overtaken_by = len(answered) - before
        for guesser in guessers:
            guesser.join()
    assert status == 200 and b"fsprobe_build_info" in body
    assert sorted(set(answered)) == [401] and len(answered) == GUESSES
    assert before < GUESSES // 2, before  # the guesses were still queued when it asked
    assert overtaken_by <= 2, overtaken_by  # those being checked at that moment, at most
