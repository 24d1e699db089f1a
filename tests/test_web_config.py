"""The web config file's parser, on data: what it accepts, and one line for what it refuses."""

from __future__ import annotations

from pathlib import Path

import bcrypt
import pytest

from exporter.web.auth import BasicAuth, credentials
from exporter.web.config import (
    RateLimit,
    WebConfig,
    WebConfigError,
    parse_web_config,
)
from tests.yaml_bombs import alias_bomb

HERE = Path("/etc/gpuscope/web")
ALICE = "$2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze"
"""The exporter-toolkit's own example hash (htpasswd's $2y$)."""
KEY = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"


def parse(text: str) -> WebConfig:
    return parse_web_config(text, directory=HERE)


def test_an_empty_file_is_an_open_endpoint() -> None:
    assert parse("") == WebConfig()
    assert parse("tls_server_config: {}\nbasic_auth_users:\n") == WebConfig()


def test_the_toolkit_example_with_everything() -> None:
    config = parse(
        f"""
tls_server_config:
  cert_file: server.crt
  key_file: /secrets/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus.monitoring.svc]
  min_version: TLS13
  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
    Strict-Transport-Security: max-age=31536000
    Content-Security-Policy: ""
basic_auth_users:
  alice: {ALICE}
rate_limit: {{interval: 100ms, burst: 20}}
"""
    )
    assert config.tls is not None
    assert config.tls.cert.path == HERE / "server.crt"
    assert config.tls.key.path == Path("/secrets/server.key")
    assert config.tls.requires_client_cert
    assert config.tls.client_ca is not None
    assert config.tls.client_ca.path == HERE / "ca.crt"
    assert config.tls.min_version == "TLS13"
    assert config.tls.cipher_suites == ("ECDHE-RSA-AES128-GCM-SHA256",)
    assert not config.tls.prefer_server_cipher_suites
    assert config.basic_auth_users == (("alice", ALICE),)
    assert dict(config.headers) == {
        "X-Frame-Options": "deny",
        "X-Content-Type-Options": "nosniff",
        "Strict-Transport-Security": "max-age=31536000",
    }
    assert config.rate_limit == RateLimit(0.1, 20)
    assert config.files() == (HERE / "server.crt", Path("/secrets/server.key"), HERE / "ca.crt")


def test_secrets_stay_out_of_reprs() -> None:
    config = parse(
        f"tls_server_config: {{cert_file: a, key: {KEY!r}}}\nbasic_auth_users: {{alice: {ALICE!r}}}"
    )
    assert "c2VjcmV0" not in repr(config)
    assert ALICE not in repr(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a list", "the web config: expected a mapping, got a list"),
        ("tls_config: {}", "the web config: unknown field 'tls_config'"),
        (
            "tls_server_config: {cert_file: a}",
            "tls_server_config: needs cert_file (or cert) and key_file (or key)",
        ),
        (
            "tls_server_config: {cert_file: a, cert: b, key_file: c}",
            "tls_server_config: cert and cert_file are mutually exclusive",
        ),
        (
            "tls_server_config: {cert_file: a, key: not-pem}",
            "tls_server_config.key: expected a PEM-encoded key",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAnyClientCert, client_ca_file: c}",
            "RequireAnyClientCert accepts certificates nobody verifies",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: Sometimes}",
            "client_auth_type: 'Sometimes' is not one of",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_ca_file: c}",
            "client_ca_file is set but client_auth_type is NoClientCert",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: VerifyClientCertIfGiven}",
            "needs client_ca_file",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, client_auth_type: VerifyClientCertIfGiven, client_ca_file: c, client_allowed_sans: [x]}",
            "client_allowed_sans: needs client_auth_type RequireAndVerifyClientCert",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, min_version: TLS14}",
            "min_version: 'TLS14' is not one of",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, min_version: TLS13, max_version: TLS12}",
            "min_version TLS13 is above max_version TLS12",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]}",
            "cipher_suites[0]: unknown or unsupported suite",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, curve_preferences: [X25519]}",
            "curve_preferences: not supported",
        ),
        (
            "tls_server_config: {cert_file: a, key_file: b, prefer_server_cipher_suites: maybe}",
            "expected true or false",
        ),
        (
            "http_server_config: {headers: {Server: nginx}}",
            "http_server_config.headers: unknown field 'Server'",
        ),
        (
            "http_server_config: {headers: {X-Frame-Options: always}}",
            "'always' is not one of deny, sameorigin",
        ),
        (
            'http_server_config: {headers: {Content-Security-Policy: "a\\r\\nSet-Cookie: x"}}',
            "control characters are not allowed",
        ),
        (
            "basic_auth_users: [alice]",
            "basic_auth_users: expected a mapping of user to bcrypt hash",
        ),
        ("basic_auth_users: {'a:b': x}", "user names are non-empty strings without ':'"),
        (
            "basic_auth_users: {alice: plain-text-password}",
            "basic_auth_users entry 1: not a bcrypt hash",
        ),
        (
            "basic_auth_users: {alice: '$2b$31$laMuVCNilHXuVdop5.sJdOvvrCKFdT1GcJT2rlglGvh/yvhfNTi.u'}",
            "bcrypt cost 31 is outside 4..16",
        ),
        ("rate_limit: {interval: 5, burst: 2}", "rate_limit.interval: expected a duration"),
        ("rate_limit: {interval: 1s, burst: 0}", "rate_limit.burst: expected a whole number"),
        ("rate_limit: {interval: 2h}", "more than 1h between requests"),
        (
            "tls_server_config: {cert_file: [a]}",
            "tls_server_config.cert_file: expected a string, got a list",
        ),
        ("a: [", "not valid YAML at line 2"),
        ("{1: 2}", "keys must be strings, got 1"),
    ],
)
def test_refusals_name_the_field(text: str, message: str) -> None:
    with pytest.raises(WebConfigError) as refused:
        parse(text)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_no_refusal_quotes_a_secret() -> None:
    secret_hash = "$2b$10$" + "x" * 52 + "!"
    for text in (
        f"basic_auth_users: {{alice: '{secret_hash}'}}",
        f"tls_server_config: {{cert_file: a, key: '{secret_hash}'}}",
        f"basic_auth_users: {{alice: '{secret_hash}'\n  bob: [",
    ):
        with pytest.raises(WebConfigError) as refused:
            parse(text)
        assert "xxxx" not in str(refused.value)


def test_a_user_given_twice_is_refused_without_naming_it() -> None:
    hashed = "$2b$10$laMuVCNilHXuVdop5.sJdOvvrCKFdT1GcJT2rlglGvh/yvhfNTi.u"
    with pytest.raises(WebConfigError) as refused:
        parse(
            f"basic_auth_users:\n  prometheus-reader: '{hashed}'\n  prometheus-reader: '{hashed}'\n"
        )
    assert str(refused.value) == "a key appears twice in one mapping (line 3)"


def test_an_alias_bomb_is_refused_at_once() -> None:
    with pytest.raises(WebConfigError, match="expands to more than 100,000 values"):
        parse("basic_auth_users: {}\n" + alias_bomb())


def test_undecodable_and_huge_inputs() -> None:
    with pytest.raises(WebConfigError, match="not UTF-8"):
        parse_web_config(b"\xff\xfe", directory=HERE)
    with pytest.raises(WebConfigError, match="larger than"):
        parse_web_config("#" * (2**20 + 1), directory=HERE)
    with pytest.raises(WebConfigError, match=r"nested too deeply|not valid YAML"):
        parse("a: " + "[" * 5000 + "]" * 5000)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Basic YWxpY2U6czNjcmV0", ("alice", "s3cret")),
        ("basic   YWxpY2U6OnM6", ("alice", ":s:")),
        ("Basic YWxpY2U=", None),  # no colon
        ("Bearer YWxpY2U6czNjcmV0", None),
        ("Basic !!!", None),
        ("Basic /w==", None),  # not UTF-8
        (None, None),
    ],
)
def test_basic_credentials(header: str | None, expected: tuple[str, str] | None) -> None:
    assert credentials(header) == expected


def test_bcrypt_answers_are_cached_by_digest_and_bounded() -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    auth = BasicAuth((("alice", hashed),), cache_size=2)
    assert auth.cached("alice", "s3cret") is None
    assert auth.verify("alice", "s3cret")
    assert auth.cached("alice", "s3cret") is True
    assert not auth.verify("alice", "wrong")
    assert not auth.verify("mallory", "s3cret"), "an unknown user never passes"
    assert not auth.verify("alice", "wrong again")
    assert auth.cached("alice", "wrong") is None, "the oldest failure was evicted"
    assert auth.cached("alice", "wrong again") is False
    assert auth.cached("alice", "s3cret") is True, "failures never evict a valid answer"
    assert not auth.verify("alice", "s" * 100), "bcrypt reads 72 bytes; longer is no error"
