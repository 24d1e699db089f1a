"""The web config file (`--web.config.file`) in Prometheus's exporter-toolkit format. Pure.

    tls_server_config:
      cert_file: server.crt              # or cert: <inline PEM>; paths are relative to this file
      key_file: server.key               # or key: <inline PEM>
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert | VerifyClientCertIfGiven
      client_ca_file: clients-ca.crt     # or client_ca: <inline PEM>
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12                 # TLS10 | TLS11 | TLS12 | TLS13
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go's names; TLS 1.2 and older
      prefer_server_cipher_suites: true
    http_server_config:
      http2: true                        # accepted; gpuscope serves HTTP/1.1
      headers: {X-Content-Type-Options: nosniff, X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2b$10$...             # bcrypt hashes
    rate_limit: {interval: 100ms, burst: 20}

`parse_web_config` takes *any* input and returns a `WebConfig` or raises `WebConfigError` (one line
naming the field), never anything else. Messages never quote a secret: neither a password hash
nor an inline key, nor the YAML around them.

Where gpuscope differs from the toolkit, it refuses rather than half-supports:
`RequestClientCert` and `RequireAnyClientCert` (a certificate nobody verifies proves nothing) and
`curve_preferences` (Python's ssl module cannot set a preference list).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from exporter import documents
from exporter.documents import quote
from exporter.durations import DurationError, parse_duration

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

MAX_BYTES: Final = 1024 * 1024
TLS_VERSIONS: Final = ("TLS10", "TLS11", "TLS12", "TLS13")
NO_CLIENT_CERT: Final = "NoClientCert"
VERIFY_IF_GIVEN: Final = "VerifyClientCertIfGiven"
REQUIRE_AND_VERIFY: Final = "RequireAndVerifyClientCert"
CLIENT_AUTH_TYPES: Final = (NO_CLIENT_CERT, VERIFY_IF_GIVEN, REQUIRE_AND_VERIFY)
_UNVERIFIED_AUTH_TYPES: Final = frozenset(
    {"RequestClientCert", "RequireAnyClientCert", "RequireClientCert"}
)
SECTION_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    # The keys each section of the file may have; basic_auth_users maps any user name.
    "tls_server_config": (
        "cert",
        "key",
        "client_ca",
        "cert_file",
        "key_file",
        "client_ca_file",
        "client_auth_type",
        "client_allowed_sans",
        "min_version",
        "max_version",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
    ),
    "http_server_config": ("http2", "headers"),
    "basic_auth_users": (),
    "rate_limit": ("interval", "burst"),
}

CIPHER_SUITES: Final = {
    # Go's (IANA) names of the TLS 1.0-1.2 suites Go offers -> OpenSSL's names.
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
}
HEADERS: Final = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)
_HEADER_VALUES: Final = {
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
}
_BCRYPT: Final = re.compile(r"\$2[abxy]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{31}")
"""Version, cost, 22 characters of salt (16 bytes: the last character carries 2 bits) and 31 of
hash, in bcrypt's base64."""
MAX_BCRYPT_COST: Final = 16
"""About 4 s per check here; a higher cost would let each wrong password stall authentication."""
_MAX_USERS: Final = 1000
_MAX_LIST: Final = 100
_MAX_TEXT: Final = 4096


class WebConfigError(ValueError):
    """A web config that cannot be used. `str()` is one line naming the field, never a secret."""


@dataclass(frozen=True, slots=True)
class Pem:
    """PEM text given inline, or the file holding it (absolute: resolved against the config's
    directory)."""

    path: Path | None = None
    inline: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    cert: Pem
    key: Pem = field(repr=False)
    client_auth_type: str = NO_CLIENT_CERT
    client_ca: Pem | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    """OpenSSL's names, in the order given; empty: OpenSSL's defaults."""
    prefer_server_cipher_suites: bool = True

    @property
    def verifies_clients(self) -> bool:
        return self.client_auth_type != NO_CLIENT_CERT

    @property
    def requires_client_cert(self) -> bool:
        return self.client_auth_type == REQUIRE_AND_VERIFY


@dataclass(frozen=True, slots=True)
class RateLimit:
    interval_seconds: float
    """Time between two requests at the sustained rate."""
    burst: int


@dataclass(frozen=True, slots=True)
class WebConfig:
    """Everything the web config file says; the defaults are an open HTTP endpoint."""

    tls: TlsServerConfig | None = None
    basic_auth_users: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """(user, bcrypt hash), sorted by user."""
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit: RateLimit | None = None

    def files(self) -> tuple[Path, ...]:
        """Files the config refers to: a change to any of them is a change to the config."""
        if self.tls is None:
            return ()
        pems = (self.tls.cert, self.tls.key, self.tls.client_ca)
        return tuple(pem.path for pem in pems if pem is not None and pem.path is not None)


def parse_web_config(text: str | bytes, *, directory: Path) -> WebConfig:
    """The config in `text`; relative paths are resolved against `directory` (the file's).
    Read the way every document is (`exporter.documents`), as one holding secrets: no error
    quotes its text."""
    return documents.load_text(
        text,
        lambda document: _web_config(document, directory),
        WebConfigError,
        source="",
        limit=MAX_BYTES,
        secret=True,
    )


# -- the document ----------------------------------------------------------------------------


def _mapping(value: object, where: str, known: tuple[str, ...]) -> dict[str, Any]:
    return documents.mapping(value, where, optional=known, null_is_empty=True, secret=True)


def _text(value: object, where: str) -> str:
    return documents.text(value, where, max_length=_MAX_TEXT, allow_empty=True, printable=False)


def _strings(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = documents.sequence(value, where, max_items=_MAX_LIST)
    return tuple(_text(item, documents.join(where, index)) for index, item in enumerate(items))


def _web_config(document: object, directory: Path) -> WebConfig:
    top = _mapping(document, "the web config", tuple(SECTION_KEYS))
    return WebConfig(
        tls=_tls(top.get("tls_server_config"), directory),
        basic_auth_users=_users(top.get("basic_auth_users")),
        headers=_http(top.get("http_server_config")),
        rate_limit=_rate_limit(top.get("rate_limit")),
    )


def _pem(
    section: dict[str, Any], inline_key: str, file_key: str, directory: Path, *, secret: bool
) -> Pem | None:
    where = "tls_server_config"
    inline, path = section.get(inline_key), section.get(file_key)
    if inline is not None and path is not None:
        raise WebConfigError(f"{where}: {inline_key} and {file_key} are mutually exclusive")
    if inline is not None:
        if not isinstance(inline, str) or "-----BEGIN" not in inline:
            # Never echo it: an inline key is a secret.
            kind = "a PEM-encoded key" if secret else "PEM-encoded certificates"
            raise WebConfigError(f"{documents.join(where, inline_key)}: expected {kind}")
        if len(inline) > MAX_BYTES:
            raise WebConfigError(
                f"{documents.join(where, inline_key)}: larger than {MAX_BYTES} bytes"
            )
        return Pem(inline=inline)
    if path is not None:
        name = _text(path, documents.join(where, file_key)).strip()
        if not name or "\x00" in name:
            raise WebConfigError(f"{documents.join(where, file_key)}: not a file name")
        return Pem(path=directory / name)
    return None


def _client_auth(section: dict[str, Any], client_ca: Pem | None) -> tuple[str, tuple[str, ...]]:
    where = "tls_server_config"
    auth = section.get("client_auth_type")
    auth = NO_CLIENT_CERT if auth in (None, "") else _text(auth, f"{where}.client_auth_type")
    if auth in _UNVERIFIED_AUTH_TYPES:
        raise WebConfigError(
            f"{where}.client_auth_type: {auth} accepts certificates nobody verifies; use "
            f"{VERIFY_IF_GIVEN} or {REQUIRE_AND_VERIFY} with client_ca_file"
        )
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{where}.client_auth_type: {quote(auth)} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    if client_ca is not None and auth == NO_CLIENT_CERT:
        raise WebConfigError(
            f"{where}: client_ca_file is set but client_auth_type is {NO_CLIENT_CERT}"
        )
    if client_ca is None and auth != NO_CLIENT_CERT:
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
    sans = _strings(section.get("client_allowed_sans"), f"{where}.client_allowed_sans")
    if sans and auth != REQUIRE_AND_VERIFY:
        raise WebConfigError(
            f"{where}.client_allowed_sans: needs client_auth_type {REQUIRE_AND_VERIFY}"
        )
    return auth, sans


def _tls(value: object, directory: Path) -> TlsServerConfig | None:
    where = "tls_server_config"
    section = _mapping(value, where, SECTION_KEYS[where])
    if not any(value is not None for value in section.values()):
        return None  # as the toolkit: an empty section means plain HTTP
    if section.get("curve_preferences") is not None:
        raise WebConfigError(
            f"{where}.curve_preferences: not supported (OpenSSL's default groups are used); "
            "remove it"
        )
    cert = _pem(section, "cert", "cert_file", directory, secret=False)
    key = _pem(section, "key", "key_file", directory, secret=True)
    if cert is None or key is None:
        raise WebConfigError(f"{where}: needs cert_file (or cert) and key_file (or key)")
    client_ca = _pem(section, "client_ca", "client_ca_file", directory, secret=False)
    auth, sans = _client_auth(section, client_ca)
    versions = []
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        version = section.get(name)
        version = default if version is None else _text(version, f"{where}.{name}")
        if version not in TLS_VERSIONS:
            raise WebConfigError(
                f"{where}.{name}: {quote(version)} is not one of {', '.join(TLS_VERSIONS)}"
            )
        versions.append(version)
    if TLS_VERSIONS.index(versions[0]) > TLS_VERSIONS.index(versions[1]):
        raise WebConfigError(
            f"{where}: min_version {versions[0]} is above max_version {versions[1]}"
        )
    suites = []
    for index, suite in enumerate(_strings(section.get("cipher_suites"), f"{where}.cipher_suites")):
        if suite not in CIPHER_SUITES:
            raise WebConfigError(
                f"{where}.cipher_suites[{index}]: unknown or unsupported suite {quote(suite)}"
            )
        suites.append(CIPHER_SUITES[suite])
    prefer = section.get("prefer_server_cipher_suites")
    return TlsServerConfig(
        cert=cert,
        key=key,
        client_auth_type=auth,
        client_ca=client_ca,
        client_allowed_sans=sans,
        min_version=versions[0],
        max_version=versions[1],
        cipher_suites=tuple(suites),
        prefer_server_cipher_suites=True
        if prefer is None
        else documents.boolean(prefer, f"{where}.prefer_server_cipher_suites"),
    )


def _users(value: object) -> tuple[tuple[str, str], ...]:
    where = "basic_auth_users"
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping of user to bcrypt hash")
    if len(value) > _MAX_USERS:
        raise WebConfigError(f"{where}: more than {_MAX_USERS} users")
    users = []
    for number, (user, hashed) in enumerate(value.items(), start=1):
        # Entries are named by their place in the file, never by a user name or a hash: a hash
        # written where the user name goes would otherwise be printed.
        entry = f"{where} entry {number}"
        if not isinstance(user, str) or not user or ":" in user or len(user) > 256:
            raise WebConfigError(f"{entry}: user names are non-empty strings without ':'")
        if not user.isprintable():
            raise WebConfigError(f"{entry}: user names must be printable")
        match = _BCRYPT.fullmatch(hashed) if isinstance(hashed, str) else None
        if match is None:
            swapped = _BCRYPT.fullmatch(user) is not None
            hint = "; the user name is a bcrypt hash: write user: hash" if swapped else ""
            raise WebConfigError(f"{entry}: not a bcrypt hash ($2b$10$ and 53 characters){hint}")
        if not 4 <= int(match["cost"]) <= MAX_BCRYPT_COST:
            raise WebConfigError(
                f"{entry}: bcrypt cost {match['cost']} is outside 4..{MAX_BCRYPT_COST}"
            )
        users.append((user, hashed))
    return tuple(sorted(users))


def _http(value: object) -> tuple[tuple[str, str], ...]:
    where = "http_server_config"
    section = _mapping(value, where, SECTION_KEYS[where])
    if section.get("http2") is not None:
        documents.boolean(section["http2"], f"{where}.http2")
    headers = _mapping(section.get("headers"), f"{where}.headers", HEADERS)
    found = []
    for name, given in headers.items():
        if given is None or given == "":
            continue  # blank: unset, as in the toolkit
        text = _text(given, f"{where}.headers.{name}")
        if any(ord(char) < 32 or ord(char) == 127 for char in text):
            raise WebConfigError(f"{where}.headers.{name}: control characters are not allowed")
        allowed = _HEADER_VALUES.get(name)
        if allowed is not None and text.lower() not in allowed:
            raise WebConfigError(
                f"{where}.headers.{name}: {quote(text)} is not one of {', '.join(allowed)}"
            )
        found.append((name, text))
    return tuple(sorted(found))


def _rate_limit(value: object) -> RateLimit | None:
    where = "rate_limit"
    section = _mapping(value, where, SECTION_KEYS[where])
    interval = section.get("interval")
    if interval is None or interval == 0:
        return None  # as the toolkit: no interval (or 0) means no limit
    if not isinstance(interval, str):
        raise WebConfigError(f"{where}.interval: expected a duration such as 100ms or 1s")
    try:
        seconds = parse_duration(interval)
    except DurationError as error:
        raise WebConfigError(f"{where}.interval: {error}") from error
    if seconds == 0:
        return None
    if seconds > 3600:
        raise WebConfigError(f"{where}.interval: more than 1h between requests")
    burst = section.get("burst", 1)
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000:
        raise WebConfigError(f"{where}.burst: expected a whole number from 1 to 1000000")
    return RateLimit(seconds, burst)
