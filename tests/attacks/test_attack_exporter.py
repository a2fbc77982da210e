"""The metrics endpoint, attacked by anyone who can reach its port (issue 13: spot checks).

The server's bounds (connections, deadlines, header sizes, slow clients) are held by
tests/exporters/test_exporter_bounds.py; these are the attacks that found a way around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Iterator

import bcrypt
import pytest

from tests.exporters.test_exporter_web import basic
from tests.support.daemon_process import DaemonProcess, clean_environment

pytestmark = pytest.mark.slow  # a bcrypt flood: the full run only

#: A realistic bcrypt cost: Prometheus' docs suggest 10 or more; `htpasswd -B` makes 5..17.
ROUNDS = 12
GUESSES = 16


@contextlib.contextmanager
def scraped_daemon(tmp_path) -> Iterator[DaemonProcess]:
    """A daemon whose basic auth knows the scraper `prometheus` (password s3cret) already."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=ROUNDS)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    env = clean_environment(TMPDIR=str(ckpt))
    with DaemonProcess(tmp_path, str(ckpt), "--web-config", str(web), env=env) as daemon:
        assert daemon.get(headers=basic("prometheus", "s3cret"))[0] == 200  # now remembered
        yield daemon


def test_wrong_passwords_do_not_queue_the_scraper_that_knows_the_right_one(tmp_path):
    """Every basic-auth check went through the two bcrypt threads, also those of credentials
    that had passed before and are answered from memory: a burst of wrong guesses (a bcrypt
    each, 0.2-0.3 s) queued Prometheus' own scrape behind all of them, and a few hundred held
    it past its deadline."""
    with scraped_daemon(tmp_path) as daemon:
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
        # The bcrypt checks that ended while the scraper waited: it queued behind those.
        # (A guess told 429 costs the scraper nothing; one that came late under load may
        # be answered while the scrape is on the wire, and says nothing of queueing.)
        checked_meanwhile = answered[before:].count(401)
        for guesser in guessers:
            guesser.join()
    assert status == 200 and b"fsprobe_build_info" in body
    # Two guesses (this address's share of the bcrypt queue) are checked; the others are
    # told at once to retry later (see the test below), so none is queued before it either.
    assert len(answered) == GUESSES and set(answered) <= {401, 429}
    assert answered.count(401) >= 1
    assert checked_meanwhile <= 2, answered  # those being checked at that moment, at most


FLOOD = 1000


async def _flood(url: str, number: int, timeout: float, sent: threading.Event) -> list[int]:
    """`number` connections at once, each with a wrong password of its own: the statuses
    (0 for a connection cut or timed out without an answer). `sent` is set once every
    connection has sent its request (or failed to)."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    waiting = [number]

    def one_sent() -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            sent.set()

    async def one(index: int) -> int:
        header = basic("prometheus", f"wrong-{index}")["Authorization"]
        request = f"GET /metrics HTTP/1.0\r\nAuthorization: {header}\r\n\r\n".encode()
        try:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), timeout
                )
                writer.write(request)
                await writer.drain()
            finally:
                one_sent()
            answer = await asyncio.wait_for(reader.read(64 * 1024), timeout)
            writer.close()
        except (OSError, asyncio.TimeoutError):
            return 0
        match = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
        return int(match[1]) if match else 0

    return list(await asyncio.gather(*(one(index) for index in range(number))))


def test_a_thousand_wrong_passwords_hold_no_slot_for_a_whole_bcrypt(tmp_path):
    """1,000 connections with distinct wrong passwords filled all 512 slots, each waiting its
    turn for one of the two bcrypt threads: the known scraper waited in the backlog until
    the request deadline cut them (8-9 s a scrape, Prometheus' timeout is 10 s), and half of
    the guessers were cut without an answer. A guess now waits for bcrypt only within a
    bounded queue (and a per-address share of it); the rest are told at once to retry later
    (429), so no connection waits its deadline and the scraper is answered among them."""
    with scraped_daemon(tmp_path) as daemon:
        statuses: list[int] = []
        sent = threading.Event()
        flood = threading.Thread(
            target=lambda: statuses.extend(asyncio.run(_flood(daemon.url, FLOOD, 60.0, sent)))
        )
        flood.start()
        # The scraper asks once every guess has asked: on the old server each would hold a
        # slot by then. (How long the flood lasts after that is the server's speed, not a
        # property: answered with 429 at once, it may well be over before the scrape.)
        assert sent.wait(120), "the flood's connections did not all send their request"
        status, body = daemon.get(headers=basic("prometheus", "s3cret"), timeout=60)
        flood.join()
        log = daemon.log()
    assert status == 200 and b"fsprobe_build_info" in body
    counts = {code: statuses.count(code) for code in set(statuses)}
    assert set(counts) <= {401, 429}, counts  # nobody cut at the deadline, nobody let in
    assert counts.get(401, 0) >= 1, counts  # guesses were checked, and failed
    assert "no complete exchange" not in log
