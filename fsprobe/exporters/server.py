"""The metrics endpoint: one event loop thread, bounded in connections, time and memory.

The bounds and why: docs/security.md, "The metrics endpoint"; HTTP/1.0, no gzip.
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from fsprobe.exporters.auth import Admission, BasicAuth
from fsprobe.exporters.webconfig import WebConfig

log = logging.getLogger(__name__)

#: Seconds from accepting a connection to the last byte of the answer.
REQUEST_DEADLINE = 10.0
#: Open connections at most (each costs a file descriptor and a few KiB). A scraper or two and
#: a person with curl need a handful; the rest is room for bursts.
MAX_CONNECTIONS = 512
#: A client still sending its request head after this many seconds may be closed to make room
#: for a new one when every slot is taken: a real scraper sends its head at once.
MIN_HEAD_AGE = 1.0
#: Connections the kernel may queue while every slot is taken.
BACKLOG = 512
#: How often a paused accept loop looks for room again.
_RECHECK = 0.1
#: The request line and headers of a GET, at most.
MAX_HEAD = 16 * 1024
#: Threads that may run bcrypt at once (about 0.1-0.3 s of CPU per failed login).
AUTH_THREADS = 2
#: Bytes handed to the transport at a time; it asks for more as the client reads.
_CHUNK = 64 * 1024

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"
_LANDING = b"""<html><head><title>fsprobe</title></head><body>
<h1>fsprobe</h1><p><a href="/metrics">Metrics</a></p></body></html>
"""


class _Security:
    """The web config in force and its authenticator, replaced together on a reload."""

    def __init__(self, web: WebConfig) -> None:
        self.web = web
        self.auth = BasicAuth(web.users)


class _ClientFailed(Exception):
    """A request that gets an error status and a log line: (status, reason)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class _Tls:
    """TLS over memory buffers: the loop never blocks in a handshake, and a failed one still
    sends its alert (the client learns why, e.g. "certificate required")."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._established = False

    def receive(self, data: bytes) -> bytes:
        """The plaintext that `data` completes (empty during the handshake); ssl.SSLError."""
        self._incoming.write(data)
        if not self._established:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self._established = True
        plaintext = bytearray()
        while True:
            try:
                chunk = self._tls.read(_CHUNK)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            plaintext += chunk
        return bytes(plaintext)

    def seal(self, plaintext: bytes | memoryview) -> bytes:
        self._tls.write(plaintext)
        return self.to_send()

    def to_send(self) -> bytes:
        """What TLS wants to send now: handshake messages, an alert, sealed records."""
        return self._outgoing.read()


class _Connection(asyncio.Protocol):
    """One client: (TLS handshake,) request head, authorization, answer, close."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.tls: _Tls | None = None
        self.client = "-"
        self.head = bytearray()
        self.head_complete = False
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.failed = False
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task | None = None

    # -- life cycle ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if peer else "-"
        self.server.admit(self)
        self.timer = self.loop.call_later(REQUEST_DEADLINE, self.expire)
        context = self.server.security.web.tls
        self.tls = _Tls(context) if context is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if not (self.failed or self.answered):  # e.g. reset by the client: still one line
            self.failed = True
            _log_failure(self.client, f"connection lost: {exc or 'closed by the client'}")
        self.server.release(self)
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.can_write.set()  # a sender waiting for room gives up at once

    def expire(self) -> None:
        """The deadline: whatever the connection is doing, it ends now."""
        phase = "sending the answer" if self.head_complete else "waiting for the request"
        self.fail(f"no complete exchange within {REQUEST_DEADLINE:g} s ({phase})")
        if self.transport is not None:
            self.transport.abort()  # also when it failed before and still had words to send

    def evict(self) -> None:
        self.fail("closed to make room: its request head was still incomplete")

    def fail(self, reason: str, last_words: bytes = b"") -> None:
        """One log line, then the connection is closed without an answer (but `last_words`)."""
        if self.failed:
            return
        self.failed = True
        _log_failure(self.client, reason)
        self.server.release(self)
        if self.transport is None:
            return
        if last_words:
            self.transport.write(last_words)
            self.transport.close()  # after sending them; the deadline still cuts a non-reader
        else:
            self.transport.abort()

    # -- reading the request ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.head_complete or self.failed:
            return  # a GET has no body worth reading
        if self.tls is not None:
            try:
                data = self.tls.receive(data)
            except ssl.SSLError as error:  # the alert in to_send() tells the client why
                self.fail(f"TLS failed: {error.reason or error}", self.tls.to_send())
                return
            assert self.transport is not None  # data comes only from a connected transport
            self.transport.write(self.tls.to_send())
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0 and len(self.head) <= MAX_HEAD:
            return
        self.head_complete = True
        self.server.head_received(self)
        if end < 0 or end > MAX_HEAD:
            self.task = self.loop.create_task(
                self.answer_error(
                    _ClientFailed("431 Request Header Fields Too Large", "head too large")
                )
            )
            return
        self.task = self.loop.create_task(self.answer(bytes(self.head[:end])))

    def eof_received(self) -> bool:
        if not self.head_complete:
            self.fail("closed before the request was complete")
        return True  # keep our side open to send the answer

    # -- answering -------------------------------------------------------------------------------

    async def answer(self, head: bytes) -> None:
        try:
            method, path, headers = _parse_head(head)
            security = self.server.security
            credentials = headers.get("authorization")
            admission = security.auth.admit(credentials, self.client)
            allowed = admission is Admission.PASS
            if admission is Admission.CHECK:
                try:
                    allowed = await self.loop.run_in_executor(
                        self.server.auth_pool, security.auth.check, credentials
                    )
                finally:
                    security.auth.release(self.client)
        except _ClientFailed as failure:
            await self.answer_error(failure)
            return
        extra = list(security.web.headers.items())
        if admission is Admission.BUSY:
            await self.send(
                "429 Too Many Requests",
                [*extra, ("Retry-After", "1"), ("Content-Type", "text/plain; charset=utf-8")],
                [b"Too many password checks at once: retry later\n"],
            )
        elif not allowed:
            await self.send(
                "401 Unauthorized",
                [*extra, ("WWW-Authenticate", 'Basic realm="fsprobe"'),
                 ("Content-Type", "text/plain; charset=utf-8")],
                [b"Unauthorized\n"],
            )  # fmt: skip
        elif method not in ("GET", "HEAD"):
            await self.send("405 Method Not Allowed", [*extra, ("Allow", "GET, HEAD")], [b""])
        elif path == "/metrics" and (trouble := self.server.health()) is not None:
            # Frozen values served as fresh would be a lie: Prometheus marks the scrape failed
            # (up 0, FsprobeDown) and the body says why.
            await self.send(
                "503 Service Unavailable",
                [*extra, ("Content-Type", "text/plain; charset=utf-8")],
                [f"fsprobe is not probing: {trouble}\n".encode()],
                method,
            )
        elif path == "/metrics":
            body = self.server.render()
            await self.send(
                "200 OK", [*extra, ("Content-Type", CONTENT_TYPE_METRICS)], body, method
            )
        elif path == "/":
            headers_out = [*extra, ("Content-Type", "text/html; charset=utf-8")]
            await self.send("200 OK", headers_out, [_LANDING], method)
        else:
            await self.send(
                "404 Not Found",
                [*extra, ("Content-Type", "text/plain")],
                [b"Not found: try /metrics\n"],
            )

    async def answer_error(self, failure: _ClientFailed) -> None:
        _log_failure(self.client, failure.reason)
        self.failed = True  # logged: nothing more to say about this client
        await self.send(
            failure.status, [("Content-Type", "text/plain")], [f"{failure.reason}\n".encode()]
        )

    async def send(
        self,
        status: str,
        headers: list[tuple[str, str]],
        body: Sequence[bytes],
        method: str = "GET",
    ) -> None:
        """Send the answer as the client takes it, then close (flow control, no copies)."""
        length = sum(len(piece) for piece in body)
        lines = [f"HTTP/1.0 {status}", *(f"{k}: {v}" for k, v in headers)]
        lines += [f"Content-Length: {length}", "Connection: close", "", ""]
        pieces = [("\r\n".join(lines)).encode("latin-1")]
        if method != "HEAD":
            pieces.extend(body)
        transport = self.transport
        assert transport is not None
        for piece in pieces:
            view = memoryview(piece)
            for start in range(0, len(view), _CHUNK):
                await self.can_write.wait()
                if transport.is_closing():
                    return
                chunk = view[start : start + _CHUNK]
                transport.write(self.tls.seal(chunk) if self.tls is not None else chunk)
        self.answered = True
        transport.close()  # after the buffered bytes are sent

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()


def _log_failure(client: str, reason: str) -> None:
    log.info("event=http_client_failed client=%s reason=%s", client, json.dumps(reason))


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, path, headers with lower-case names) of an HTTP/1.x request head."""
    try:
        text = head.decode("latin-1")
        request_line, *header_lines = text.split("\r\n")
        method, target, version = request_line.split(" ")
    except ValueError:
        raise _ClientFailed("400 Bad Request", "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise _ClientFailed("505 HTTP Version Not Supported", f"unsupported version {version!r}")
    headers = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise _ClientFailed("400 Bad Request", "malformed header line")
        headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


class MetricsServer:
    """Serves `render()` at /metrics on `address`, as the web config says."""

    def __init__(
        self,
        address: tuple[str, int],
        render: Callable[[], Sequence[bytes]],
        web: WebConfig,
        health: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`render` returns the body of /metrics, in one or more pieces; `health` says why the
        metrics are not to be trusted now (then /metrics answers 503), None while they are.
        Binds at once, so that an address in use is an error of the caller, before anything
        runs."""
        self.render = render
        self.health = health
        self.security = _Security(web)
        host, port = address
        family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind(sockaddr[:2])
            self._socket.listen(BACKLOG)
        except OSError:
            self._socket.close()
            raise
        self._socket.setblocking(False)
        self._address = self._socket.getsockname()[:2]
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_log_loop_error)
        self.auth_pool = ThreadPoolExecutor(AUTH_THREADS, thread_name_prefix="fsprobe-auth")
        self._open: dict[_Connection, None] = {}
        self._waiting_for_head: dict[_Connection, float] = {}  # oldest first: when accepted
        self._attaching = 0  # accepted, not yet admitted
        self._accepting = False
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._address
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"{self.security.web.scheme}://{host}:{port}/metrics"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fsprobe-http", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._resume_accepting()
        try:
            self.loop.run_forever()
        finally:
            self._pause_accepting()
            for connection in list(self._open):
                if connection.transport is not None:
                    connection.transport.abort()
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.close()

    def stop(self) -> None:
        """Stop serving at once; open connections are dropped."""
        if self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
            self._thread = None
        elif not self.loop.is_closed():
            self.loop.close()
        self._socket.close()
        self.auth_pool.shutdown(wait=False)

    def reconfigure(self, web: WebConfig) -> None:
        """Use new TLS settings and users from the next connection on."""
        self.security = _Security(web)

    # -- accepting, within the bound (loop thread only) -------------------------------------------

    def _resume_accepting(self) -> None:
        if not self._accepting:
            self._accepting = True
            self.loop.add_reader(self._socket.fileno(), self._accept)

    def _pause_accepting(self) -> None:
        if self._accepting:
            self._accepting = False
            self.loop.remove_reader(self._socket.fileno())

    def _accept(self) -> None:
        """Accept what the backlog holds, as long as there is (or can be made) room.

        Without room, accepting pauses: new clients wait in the kernel's backlog, and a check
        every `_RECHECK` seconds lets them in as slots free up or slow clients become evictable.
        """
        while True:
            if len(self._open) + self._attaching >= MAX_CONNECTIONS and not self._make_room():
                self._pause_accepting()
                self.loop.call_later(_RECHECK, self._accept_if_paused)
                return
            try:
                client, _address = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # EMFILE, ENFILE, ENOBUFS: out of something, not our bug
                log.warning("event=http_accept_failed message=%s", json.dumps(str(error)))
                self._pause_accepting()
                self.loop.call_later(_RECHECK, self._accept_if_paused)
                return
            client.setblocking(False)
            self._attaching += 1
            self.loop.create_task(self._attach(client))

    def _accept_if_paused(self) -> None:
        if not self._accepting and not self.loop.is_closed():
            self._resume_accepting()
            self._accept()

    async def _attach(self, client: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: _Connection(self), client)
        except OSError as error:
            client.close()
            _log_failure("-", f"cannot set up the connection: {error}")
        finally:
            self._attaching -= 1

    def _make_room(self) -> bool:
        """Evict the oldest client still sending its head, if it has had `MIN_HEAD_AGE` s.

        A client whose bytes wait unread in its socket is not slow: this loop is (a burst of
        connections on a loaded machine), and it keeps its place. Evicting by age alone cut
        hundreds of clients that had sent their whole request, unanswered.
        """
        now = time.monotonic()
        old = []
        for connection, accepted in self._waiting_for_head.items():  # oldest first
            if now - accepted < MIN_HEAD_AGE:
                break
            old.append(connection)
        unread = _with_unread_bytes(old)
        for connection in old:
            if connection not in unread:
                connection.evict()
                return True
        return False

    # -- the connection table (loop thread only) -------------------------------------------------

    def admit(self, connection: _Connection) -> None:
        self._open[connection] = None
        self._waiting_for_head[connection] = time.monotonic()

    def head_received(self, connection: _Connection) -> None:
        self._waiting_for_head.pop(connection, None)

    def release(self, connection: _Connection) -> None:
        self._open.pop(connection, None)
        self._waiting_for_head.pop(connection, None)


def _with_unread_bytes(connections: Sequence[_Connection]) -> set[_Connection]:
    """Those of `connections` whose socket has bytes (or an end) we have not read yet."""
    by_fd = {}
    poller = select.poll()
    for connection in connections:
        sock = connection.transport.get_extra_info("socket") if connection.transport else None
        if sock is not None and sock.fileno() >= 0:
            by_fd[sock.fileno()] = connection
            poller.register(sock.fileno(), select.POLLIN)
    return {by_fd[fd] for fd, _events in poller.poll(0) if fd in by_fd}


def _log_loop_error(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """asyncio's own complaints, one line each: never a traceback in a one-event-per-line log."""
    error = context.get("exception")
    detail = f"{type(error).__name__}: {error}" if error is not None else ""
    log.warning("event=http_error message=%r error=%r", context.get("message", ""), detail)
