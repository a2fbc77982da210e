"""The metrics endpoint: prometheus_client's threading WSGI server, with TLS and basic auth.

What differs from `prometheus_client.start_http_server`, and why:

- the TLS handshake happens in the connection's own thread, not in the accepting loop, so a
  client that connects and stays silent cannot stall every other scrape;
- basic auth (bcrypt) in front of every path, as exporter-toolkit does;
- the body comes from `Exposition.render()`, the cached rendering, so a scrape sends bytes that
  are ready and never waits for a probe;
- no reverse DNS lookup of the listen address at start (`HTTPServer.server_bind` does one);
- the security settings can be swapped on a reload without dropping the socket.

Responses are not gzip-compressed even when asked: compressing a large exposition costs more
CPU than the scrape itself, and a scrape of a node daemon travels over a local network.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterable, Sequence
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer

from fsprobe.exporters.auth import BasicAuth
from fsprobe.exporters.webconfig import WebConfig

log = logging.getLogger(__name__)

#: Seconds a client may take for the TLS handshake, and may stay idle on a connection.
CLIENT_TIMEOUT = 10.0

_LANDING = b"""<html><head><title>fsprobe</title></head><body>
<h1>fsprobe</h1><p><a href="/metrics">Metrics</a></p></body></html>
"""


class _Handler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT

    def log_message(self, format: str, *args: object) -> None:
        """No access log: a scrape every 15 s is not an event."""


class _Server(ThreadingWSGIServer):
    """One listening socket; each connection is served (and TLS-wrapped) in its own thread."""

    def __init__(self, address: tuple[str, int], family: int, security: _Security) -> None:
        self.address_family = family
        self.security = security
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def finish_request(self, request, client_address) -> None:  # type: ignore[override]
        context = self.security.web.tls
        if context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(CLIENT_TIMEOUT)
        try:
            secure = context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            log.debug(
                "event=tls_handshake_failed client=%s message=%r", client_address[0], str(error)
            )
            return
        try:
            super().finish_request(secure, client_address)
        finally:
            secure.close()


class _Security:
    """The web config in force and its authenticator, replaced together on a reload."""

    def __init__(self, web: WebConfig) -> None:
        self.web = web
        self.auth = BasicAuth(web.users)


class MetricsServer:
    """Serves `render()` at /metrics on `address`, as the web config says."""

    def __init__(
        self, address: tuple[str, int], render: Callable[[], Sequence[bytes]], web: WebConfig
    ) -> None:
        """`render` returns the body of /metrics, in one or more pieces."""
        self._render = render
        host, port = address
        family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self._server = _Server(sockaddr[:2], family, _Security(web))
        self._server.set_app(self._app)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"{self._server.security.web.scheme}://{host}:{port}/metrics"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},  # so that stop() returns within a tenth of a second
            name="fsprobe-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread = None
        self._server.server_close()

    def reconfigure(self, web: WebConfig) -> None:
        """Use new TLS settings and users from the next connection on."""
        self._server.security = _Security(web)

    def _app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        security = self._server.security
        headers = list(security.web.headers.items())
        if not security.auth.check(environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized",
                [
                    *headers,
                    ("WWW-Authenticate", 'Basic realm="fsprobe"'),
                    ("Content-Type", "text/plain; charset=utf-8"),
                ],
            )
            return [b"Unauthorized\n"]
        path, method = environ.get("PATH_INFO", "/"), environ["REQUEST_METHOD"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [*headers, ("Allow", "GET, HEAD")])
            return [b""]
        if path == "/metrics":
            body, content_type = list(self._render()), CONTENT_TYPE_PLAIN_0_0_4
        elif path == "/":
            body, content_type = [_LANDING], "text/html; charset=utf-8"
        else:
            start_response("404 Not Found", [*headers, ("Content-Type", "text/plain")])
            return [b"Not found: try /metrics\n"]
        start_response(
            "200 OK",
            [
                *headers,
                ("Content-Type", content_type),
                ("Content-Length", str(sum(len(piece) for piece in body))),
            ],
        )
        return body if method == "GET" else [b""]
