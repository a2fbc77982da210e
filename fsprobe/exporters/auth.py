"""Basic auth against bcrypt hashes, as the Prometheus exporters check it.

A bcrypt check costs about 100 ms of CPU by design, and Prometheus sends the same credentials
on every scrape; so a successful check is remembered (as a SHA-256 digest of user, password and
hash, never the password) and later scrapes cost microseconds. Failed checks are not
remembered: guessing stays as slow as bcrypt makes it. An unknown user is checked against a
dummy hash, so that the answer takes as long as for a known one, and the digests are compared
in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
from collections.abc import Mapping

from fsprobe.exporters.webconfig import import_extra


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

    @property
    def required(self) -> bool:
        return bool(self._users)

    def remembered(self, header: str | None) -> bool:
        """Whether the request may pass without a bcrypt check: no users are configured, or
        these credentials passed one before.

        Microseconds, so the server asks this on its event loop and sends only the rest to
        the bcrypt threads: a flood of wrong passwords then queues nobody who knows the
        right one (Prometheus scraping, after its first scrape).
        """
        if not self._users:
            return True
        credentials = _parse(header)
        return credentials is not None and self._remembered(*credentials)

    def _digest(self, user: str, password: bytes) -> bytes:
        hashed = self._users.get(user) or b""
        return hashlib.sha256(b"\0".join((user.encode(), password, hashed))).digest()

    def _remembered(self, user: str, password: bytes) -> bool:
        with self._lock:
            known = self._verified.get(user)
        return known is not None and hmac.compare_digest(known, self._digest(user, password))

    def check(self, header: str | None) -> bool:
        """Whether the request may pass: always when no users are configured."""
        if not self._users:
            return True
        credentials = _parse(header)
        if credentials is None:
            return False
        user, password = credentials
        if self._remembered(user, password):
            return True
        hashed = self._users.get(user)
        try:
            valid = self._bcrypt.checkpw(password, hashed or self._dummy) and hashed is not None
        except ValueError:  # a password longer than bcrypt's 72 bytes
            return False
        if valid:
            with self._lock:
                self._verified[user] = self._digest(user, password)
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
