"""TLS and basic auth on /metrics through --web-config, in exporter-toolkit's format.

Certificates are made for the test by the `openssl` command (no Python crypto package needed);
bcrypt hashes use the lowest cost so that the suite stays fast.
"""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from fsprobe.exporters import auth as auth_module
from fsprobe.exporters.auth import Admission, BasicAuth
from fsprobe.exporters.server import MetricsServer
from fsprobe.exporters.webconfig import WebConfig, WebConfigError, load_web_config
from tests.support.capability import need_command
from tests.support.daemon_process import DaemonProcess, clean_environment, run_fsprobe


def openssl(*args: str) -> None:
    subprocess.run([need_command("openssl", "openssl"), *args], check=True, capture_output=True)


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def client_cert(directory: Path, ca_cert: Path, ca_key: Path) -> tuple[Path, Path]:
    """A client certificate signed by the given CA."""
    key, csr, cert = directory / "client.key", directory / "client.csr", directory / "client.crt"
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=prometheus",
            "-keyout", str(key), "-out", str(csr))  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "1", "-out", str(cert))  # fmt: skip
    return cert, key


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def client_context(cafile: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cafile))
    return context


def test_tls_and_basic_auth_on_a_running_daemon(tmp_path):
    cert, _key = self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        "  cert_file: server.crt\n"  # relative to the web config's directory
        "  key_file: server.key\n"
        "basic_auth_users:\n"
        f"  prometheus: '{hashed('s3cret')}'\n"
    )
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    daemon = DaemonProcess(
        tmp_path, str(ckpt), "--web-config", str(web), env=clean_environment(TMPDIR=str(ckpt))
    )
    with daemon:
        assert daemon.url.startswith("https://127.0.0.1:")
        context = client_context(cert)
        status, body = daemon.get(context=context)
        assert status == 401 and b"fsprobe_" not in body
        assert daemon.get(headers=basic("prometheus", "wrong"), context=context)[0] == 401
        assert daemon.get(headers=basic("nobody", "s3cret"), context=context)[0] == 401
        status, body = daemon.get(headers=basic("prometheus", "s3cret"), context=context)
        assert status == 200 and b"fsprobe_build_info" in body
        # The cached success does not let a wrong password through afterwards.
        assert daemon.get(headers=basic("prometheus", "s3cre"), context=context)[0] == 401
        assert daemon.get(headers=basic("prometheus", "s3cret"), context=context)[0] == 200
        # Plain HTTP on the TLS port gets nothing.
        plain = daemon.url.replace("https://", "http://").rsplit("/metrics", 1)[0]
        with pytest.raises(OSError):
            urllib.request.urlopen(plain + "/metrics", timeout=3).read()
        # A client that does not trust the certificate is refused by its own TLS check.
        with pytest.raises(OSError):
            daemon.get(headers=basic("prometheus", "s3cret"), context=ssl.create_default_context())


def test_unauthorized_answer_asks_for_basic_auth(tmp_path):
    server = MetricsServer(
        ("127.0.0.1", 0), lambda: (b"m 1\n",), WebConfig(users={"u": hashed("p").encode()})
    )
    server.start()
    try:
        with socket.create_connection(server.address, timeout=5) as connection:
            connection.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            reply = connection.makefile("rb").read()
    finally:
        server.stop()
    assert reply.startswith(b"HTTP/1.0 401")
    assert b'WWW-Authenticate: Basic realm="fsprobe"' in reply


def test_plain_http_without_web_config_paths_and_methods(tmp_path):
    server = MetricsServer(("127.0.0.1", 0), lambda: (b"fsprobe_x 1\n",), WebConfig())
    server.start()
    host, port = server.address
    try:

        def request(raw: bytes) -> bytes:
            with socket.create_connection((host, port), timeout=5) as connection:
                connection.sendall(raw)
                return connection.makefile("rb").read()

        metrics = request(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert metrics.startswith(b"HTTP/1.0 200") and metrics.endswith(b"\r\n\r\nfsprobe_x 1\n")
        assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8" in metrics
        assert request(b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200")
        assert request(b"GET /other HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 404")
        assert request(b"POST /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 405")
    finally:
        server.stop()


def test_a_silent_client_does_not_stall_other_scrapes(tmp_path):
    cert, key = self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    server = MetricsServer(("127.0.0.1", 0), lambda: (b"m 1\n",), load_web_config(str(web)))
    server.start()
    try:
        with socket.create_connection(server.address, timeout=5):  # connects, never handshakes
            context = client_context(cert)
            with (
                socket.create_connection(server.address, timeout=5) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as secure,
            ):
                secure.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                reply = secure.makefile("rb").read()
        assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"m 1\n")
    finally:
        server.stop()


def test_client_certificates_are_required_and_verified(tmp_path):
    ca_cert, ca_key = self_signed(tmp_path, "ca")
    cert, _key = self_signed(tmp_path, "server")
    client, client_key = client_cert(tmp_path, ca_cert, ca_key)
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        "  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        "  min_version: TLS13\n"
    )
    server = MetricsServer(("127.0.0.1", 0), lambda: (b"m 1\n",), load_web_config(str(web)))
    server.start()

    def scrape(context: ssl.SSLContext) -> bytes:
        with (
            socket.create_connection(server.address, timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as secure,
        ):
            secure.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            return secure.makefile("rb").read()

    try:
        with_cert = client_context(cert)
        with_cert.load_cert_chain(str(client), str(client_key))
        assert scrape(with_cert).endswith(b"m 1\n")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            scrape(client_context(cert))  # no client certificate
        old = client_context(cert)
        old.load_cert_chain(str(client), str(client_key))
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((ssl.SSLError, ConnectionError)):
            scrape(old)  # below min_version
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  ciphers: x\n",
         "tls_server_config.ciphers: unknown key"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
         "tls_server_config.cipher_suites: not supported"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  client_auth_type: RequireAnyClientCert\n", "without verifying it"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  min_version: TLS14\n", "tls_server_config.min_version: expected one of"),
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n",
         "tls_server_config.cert_file: cannot load"),
        ("tls_server_config:\n  key_file: server.key\n", "cert_file: a file name is required"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
         "  client_auth_type: RequireAndVerifyClientCert\n", "client_ca_file: a file name"),
        ("basic_auth_users:\n  alice: plaintext\n", "basic_auth_users.alice: expected a bcrypt"),
        ("basic_auth_user:\n  alice: x\n", "basic_auth_user: unknown key"),
        ("tls_server_config: [1, 2]\n", "tls_server_config: expected a mapping"),
        ("basic_auth_users:\n  alice: [\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_web_configs_are_refused_with_the_key(tmp_path, text, message):
    self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(text)
    with pytest.raises(WebConfigError, match=message) as caught:
        load_web_config(str(web))
    assert str(caught.value).startswith(str(web))


def test_an_empty_web_config_means_plain_http(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("# nothing yet\n")
    config = load_web_config(str(web))
    assert config.tls is None and not config.users and config.scheme == "http"
    assert load_web_config(None) == WebConfig()


def test_a_bad_web_config_is_refused_at_start(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: nothash\n")
    code, _out, err = run_fsprobe(
        "run", str(tmp_path), "--web-config", str(web), "--state-dir", str(tmp_path / "s")
    )
    assert code == 69
    assert f"{web}: basic_auth_users.alice: expected a bcrypt hash" in err


def test_basic_auth_accepts_only_the_right_password_and_caches_successes():
    auth = BasicAuth({"alice": hashed("right").encode(), "bob": hashed("other").encode()})
    assert auth.required
    assert auth.check(basic("alice", "right")["Authorization"])
    assert auth.check(basic("alice", "right")["Authorization"])  # from the cache
    assert not auth.check(basic("alice", "wrong")["Authorization"])
    assert not auth.check(basic("bob", "right")["Authorization"])
    assert not auth.check(basic("carol", "right")["Authorization"])
    assert not auth.check(basic("alice", "x" * 100)["Authorization"])  # beyond bcrypt's 72 bytes
    for header in (None, "", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"x").decode()):
        assert not auth.check(header)
    assert BasicAuth({}).check(None)


def test_basic_auth_is_safe_to_use_from_many_threads():
    auth = BasicAuth({"alice": hashed("right").encode()})
    results: list[bool] = []

    def check(password: str) -> None:
        results.append(auth.check(basic("alice", password)["Authorization"]))

    threads = [threading.Thread(target=check, args=(p,)) for p in ["right", "wrong"] * 8]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 8 + [True] * 8


def test_bcrypt_checks_are_admitted_within_a_queue_and_a_share_per_address():
    """A wrong password must not hold a connection for its turn at bcrypt: what the bounded
    queue (and one address's share of it) cannot take is refused at once, and a verdict
    reached is remembered, so repeating a credential costs no bcrypt either way."""
    auth = BasicAuth({"alice": hashed("right").encode()})
    wrong = [basic("alice", f"wrong-{n}")["Authorization"] for n in range(auth_module.QUEUE + 1)]
    first, second, third = wrong[:3]
    assert auth.admit(first, "10.0.0.1") is Admission.CHECK
    assert auth.admit(second, "10.0.0.1") is Admission.CHECK
    assert auth.admit(third, "10.0.0.1") is Admission.BUSY  # that address's share is taken
    others = [auth.admit(header, f"10.0.1.{n}") for n, header in enumerate(wrong[2:])]
    assert others == [Admission.CHECK] * (auth_module.QUEUE - 2) + [Admission.BUSY]
    assert not auth.check(first)
    auth.release("10.0.0.1")
    assert auth.admit(first, "10.0.0.1") is Admission.FAIL  # remembered: no bcrypt, no place
    assert auth.admit(third, "10.0.0.1") is Admission.CHECK  # the place given back
    right = basic("alice", "right")["Authorization"]
    assert auth.admit(right, "10.0.0.1") is Admission.BUSY  # a first login waits its turn too
    assert auth.check(right)
    assert auth.admit(right, "10.0.0.1") is Admission.PASS  # and then never again
    assert auth.admit(None, "10.0.0.1") is Admission.FAIL  # nothing to check: no bcrypt
    assert BasicAuth({}).admit(None, "10.0.0.1") is Admission.PASS


def test_a_failure_is_remembered_only_for_a_while_and_in_bounded_number(monkeypatch):
    monkeypatch.setattr(auth_module, "FAILURES_KEPT", 2)
    auth = BasicAuth({"alice": hashed("right").encode()})
    headers = [basic("alice", f"wrong-{n}")["Authorization"] for n in range(3)]
    for header in headers:
        assert not auth.check(header)
    assert auth.admit(headers[0], "a") is Admission.CHECK  # the oldest was forgotten
    auth.release("a")
    assert auth.admit(headers[2], "a") is Admission.FAIL
    later = time.monotonic() + auth_module.FAILURE_MEMORY + 1
    monkeypatch.setattr(auth_module.time, "monotonic", lambda: later)
    assert auth.admit(headers[2], "a") is Admission.CHECK  # FAILURE_MEMORY is over
