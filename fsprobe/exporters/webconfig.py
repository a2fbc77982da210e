"""`--web-config FILE`: TLS and basic auth in exporter-toolkit's YAML format (docs/reference.md).

Unknown keys, and options Python's `ssl` cannot honour as Go does, are refused. pyyaml and
bcrypt are imported only when a web config is given (the `web` extra).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsprobe.extras import install_hint

EXTRA_HINT = install_hint("web")

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNSUPPORTED = {
    "cipher_suites": "Python's ssl module uses OpenSSL's cipher defaults",
    "curve_preferences": "Python's ssl module uses OpenSSL's curve defaults",
    "prefer_server_cipher_suites": "Python's ssl module uses OpenSSL's defaults",
    "client_allowed_sans": "not implemented by fsprobe",
    "cert": "give the certificate as cert_file",
    "key": "give the key as key_file",
    "client_ca": "give the CA certificates as client_ca_file",
}
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
)


class WebConfigError(Exception):
    """The web config cannot be used; the message names the file, key and reason."""


def import_extra(module: str) -> Any:
    """Import pyyaml or bcrypt, or say which extra provides it."""
    try:
        return __import__(module)
    except ImportError:
        raise WebConfigError(
            f"--web-config needs the Python package {module!r}: {EXTRA_HINT}"
        ) from None


@dataclass(frozen=True)
class WebConfig:
    """What the metrics server enforces: TLS (a server context) and the basic-auth users."""

    source: str | None = None
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


def load_web_config(path: str | None) -> WebConfig:
    """Read and check `path` (None: plain HTTP, nobody asked for a login)."""
    if not path:
        return WebConfig()
    yaml = import_extra("yaml")
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except OSError as error:
        raise WebConfigError(f"{path}: cannot read the web config: {error.strerror}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise WebConfigError(f"{where}: not valid YAML: {error}") from None
    return _WebConfigReader(path).read(document if document is not None else {})


class _WebConfigReader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.base = os.path.dirname(os.path.abspath(path))

    def error(self, key: str, reason: str) -> WebConfigError:
        return WebConfigError(f"{self.path}: {key}: {reason}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}")
        for name in value:
            if name in _UNSUPPORTED:
                raise self.error(f"{key}.{name}", f"not supported: {_UNSUPPORTED[name]}")
            if allowed and name not in allowed:
                raise self.error(f"{key}.{name}", f"unknown key (known: {', '.join(allowed)})")
        return value

    def read(self, document: Any) -> WebConfig:
        top = self.mapping(
            document, "web config", ("tls_server_config", "http_server_config", "basic_auth_users")
        )
        tls = None
        if top.get("tls_server_config") is not None:
            tls = self.tls(self.mapping(top["tls_server_config"], "tls_server_config", _TLS_KEYS))
        headers: dict[str, str] = {}
        if top.get("http_server_config") is not None:
            http = self.mapping(
                top["http_server_config"], "http_server_config", ("http2", "headers")
            )
            headers = self.headers(http.get("headers") or {})
        users = self.users(top.get("basic_auth_users") or {})
        return WebConfig(os.path.abspath(self.path), tls, users, headers)

    def file(self, tls: Mapping[str, Any], key: str) -> str:
        value = tls.get(key)
        if not isinstance(value, str) or not value:
            raise self.error(f"tls_server_config.{key}", "a file name is required")
        return os.path.join(self.base, value)

    def tls(self, tls: Mapping[str, Any]) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        cert, key = self.file(tls, "cert_file"), self.file(tls, "key_file")
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as error:
            raise self.error(
                "tls_server_config.cert_file", f"cannot load {cert} with key {key}: {error}"
            ) from None
        for bound, attribute, default in (
            ("min_version", "minimum_version", "TLS12"),
            ("max_version", "maximum_version", None),
        ):
            name = tls.get(bound, default)
            if name is None:
                continue
            if name not in _TLS_VERSIONS:
                raise self.error(
                    f"tls_server_config.{bound}",
                    f"expected one of {', '.join(_TLS_VERSIONS)}, got {name!r}",
                )
            setattr(context, attribute, _TLS_VERSIONS[name])
        auth = tls.get("client_auth_type", "NoClientCert")
        if auth not in _CLIENT_AUTH:
            reason = (
                "Python's ssl module cannot accept a client certificate without verifying it"
                if auth in ("RequestClientCert", "RequireAnyClientCert")
                else f"expected one of {', '.join(_CLIENT_AUTH)}, got {auth!r}"
            )
            raise self.error("tls_server_config.client_auth_type", reason)
        context.verify_mode = _CLIENT_AUTH[auth]
        if auth != "NoClientCert":
            ca = self.file(tls, "client_ca_file")
            try:
                context.load_verify_locations(ca)
            except (OSError, ssl.SSLError) as error:
                raise self.error("tls_server_config.client_ca_file", f"{ca}: {error}") from None
        return context

    def headers(self, headers: Any) -> dict[str, str]:
        if not isinstance(headers, dict) or not all(
            isinstance(name, str) and isinstance(value, str) for name, value in headers.items()
        ):
            raise self.error("http_server_config.headers", "expected a mapping of strings")
        return dict(headers)

    def users(self, users: Any) -> dict[str, bytes]:
        if not isinstance(users, dict):
            raise self.error("basic_auth_users", "expected a mapping of user: bcrypt hash")
        checked = {}
        for user, hashed in users.items():
            if not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
                raise self.error(
                    f"basic_auth_users.{user}",
                    "expected a bcrypt hash ($2b$...), e.g. from `htpasswd -nBC 12 USER`",
                )
            checked[str(user)] = hashed.encode("ascii")
        if checked:
            import_extra("bcrypt")  # fail at start, not at the first scrape
        return checked
