"""Basic auth against bcrypt hashes, as the Prometheus exporters check it.

Verdicts remembered as digests, bcrypt admitted in a bounded queue (`admit`): docs/security.md,
"The metrics endpoint".
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping

from fsprobe.exporters.webconfig import import_extra

#: bcrypt checks that may wait or run at once, from all clients together.
QUEUE = 8
#: Of those, how many one client address may hold: a flood from one host leaves the rest of
#: the queue to others (a scraper's first scrape after a restart, from its own address).
PER_ADDRESS = 2
#: Seconds a failed credential is answered from memory, and how many are remembered.
FAILURE_MEMORY = 60.0
FAILURES_KEPT = 4096


class Admission(enum.Enum):
    """What `BasicAuth.admit` decided for a request."""

    PASS = "pass"  # no users configured, or these credentials passed before
    FAIL = "fail"  # no usable credentials, or these failed recently
    BUSY = "busy"  # needs a bcrypt, and the queue (or this address's share) is full
    CHECK = "check"  # needs a bcrypt: run `check`, then `release` the place


class BasicAuth:
    """Checks ``Authorization: Basic ...`` headers against `users` (user -> bcrypt hash)."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._bcrypt = import_extra("bcrypt") if self._users else None
        self._dummy = (
            self._bcrypt.hashpw(b"fsprobe", self._bcrypt.gensalt()) if self._bcrypt else b""
        )
        self._lock = threading.Lock()
        self._verified: dict[str, bytes] = {}  # user -> digest of the last password that passed
        self._failed: OrderedDict[bytes, float] = OrderedDict()  # digest -> remembered until
        self._queued = 0  # admitted bcrypt checks not yet released (the event loop's only)
        self._queued_by: dict[str, int] = {}  # the same, per client address

    @property
    def required(self) -> bool:
        return bool(self._users)

    def admit(self, header: str | None, client: str) -> Admission:
        """What to do with a request from `client` carrying `header`, in microseconds.

        Called on the server's event loop (as is `release`), so that only what needs a bcrypt
        goes to the bcrypt threads, and only as much of it as the queue holds.
        """
        if not self._users:
            return Admission.PASS
        credentials = _parse(header)
        if credentials is None:
            return Admission.FAIL
        digest = self._digest(*credentials)
        with self._lock:
            if hmac.compare_digest(self._verified.get(credentials[0], b""), digest):
                return Admission.PASS
            if self._failed.get(digest, 0.0) > time.monotonic():
                return Admission.FAIL
        if self._queued >= QUEUE or self._queued_by.get(client, 0) >= PER_ADDRESS:
            return Admission.BUSY
        self._queued += 1
        self._queued_by[client] = self._queued_by.get(client, 0) + 1
        return Admission.CHECK

    def release(self, client: str) -> None:
        """The bcrypt check admitted for `client` is over."""
        self._queued -= 1
        left = self._queued_by.pop(client, 1) - 1
        if left:
            self._queued_by[client] = left

    def _digest(self, user: str, password: bytes) -> bytes:
        hashed = self._users.get(user) or b""
        return hashlib.sha256(b"\0".join((user.encode(), password, hashed))).digest()

    def check(self, header: str | None) -> bool:
        """Whether the request may pass (always when no users are configured): the bcrypt
        check, which also records its verdict for `admit`."""
        if not self._users:
            return True
        credentials = _parse(header)
        if credentials is None:
            return False
        user, password = credentials
        digest = self._digest(user, password)
        with self._lock:
            if hmac.compare_digest(self._verified.get(user, b""), digest):
                return True
        hashed = self._users.get(user)
        try:
            assert self._bcrypt is not None
            valid = self._bcrypt.checkpw(password, hashed or self._dummy) and hashed is not None
        except ValueError:  # a password longer than bcrypt's 72 bytes
            valid = False
        with self._lock:
            if valid:
                self._verified[user] = digest
            else:
                self._failed[digest] = time.monotonic() + FAILURE_MEMORY
                self._failed.move_to_end(digest)
                while len(self._failed) > FAILURES_KEPT:
                    self._failed.popitem(last=False)
        return valid


def _parse(header: str | None) -> tuple[str, bytes] | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    return user.decode("utf-8", "replace"), password
