"""Property-based fuzzing of every parser that reads outside input: whatever the input, the answer
is a value or the parser's one documented error — never another exception.

| parser | documented error |
|---|---|
| cgroup files (`exporter.attribution.cgroups`) | `CgroupFormatError` |
| durations (`exporter.durations`) | `DurationError` |
| settings from flags, environment and YAML (`exporter.config`) | `ConfigError` |
| calibration profiles (`exporter.calibration.parse`) | `ProfileError` |
| the web config (`exporter.web.config`) | `WebConfigError` |
| HTTP requests (`exporter.web.http.RequestReader`, over llhttp) | `BadRequest` |

The listener (`exporter.web.server`) is fuzzed too, over a loopback socket: whatever a client
sends, in whatever pieces, nothing raises out of its protocol and every answer is one of its
statuses.

Each property runs a bounded number of examples (hypothesis keeps the failing ones in
`.hypothesis/` and tries them first next time), so the whole file takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import config
from exporter.attribution.cgroups import (
    CgroupFormatError,
    container_from_cgroup_file,
    container_from_cgroup_path,
)
from exporter.calibration.parse import parse_profile, parse_profile_text
from exporter.calibration.profile import ProfileError, dump_profile
from exporter.durations import DurationError, format_duration, parse_duration
from exporter.web.config import SECTION_KEYS, WebConfigError, parse_web_config
from exporter.web.http import BadRequest, Request, RequestReader, Response, routed
from exporter.web.server import Connections, Listener
from tests.profiles import gpu_profile

if TYPE_CHECKING:
    import random
    from collections.abc import Iterable

BOUNDED = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- building blocks that look like the real thing, so the fuzzer gets past the first check ----

HEX = st.text("0123456789abcdef", min_size=1, max_size=70)
UID = st.sampled_from(
    [
        "7c3f9a52-1d2e-4b7a-9c21-0a1b2c3d4e5f",
        "7c3f9a52_1d2e_4b7a_9c21_0a1b2c3d4e5f",
        "b1e89a2fcc688644de3eb95aee8025ce",
    ]
)
CGROUP_PART = st.one_of(
    st.sampled_from(
        [
            "kubepods.slice",
            "kubepods",
            "burstable",
            "besteffort",
            "..",
            "kubepods-burstable.slice",
            "system.slice",
            "container",
            "crio-conmon-" + "ab" * 32 + ".scope",
        ]
    ),
    st.builds(lambda uid: f"kubepods-burstable-pod{uid}.slice", UID),
    st.builds(lambda uid: f"pod{uid}", UID),
    st.builds(
        lambda runtime, cid: f"{runtime}-{cid}.scope",
        st.sampled_from(["cri-containerd", "crio", "docker", "x"]),
        HEX,
    ),
    st.builds(lambda uid, cid: f"kubepods-pod{uid}.slice:cri-containerd:{cid}", UID, HEX),
    HEX,
    st.text(max_size=20),
)
CGROUP_PATH = st.lists(CGROUP_PART, max_size=8).map(lambda parts: "/" + "/".join(parts))
CGROUP_LINE = st.one_of(
    st.builds(
        lambda h, c, p: f"{h}:{c}:{p}",
        st.one_of(st.integers(0, 20).map(str), st.text(max_size=3)),
        st.sampled_from(["", "cpu,cpuacct", "name=systemd", "memory"]),
        CGROUP_PATH,
    ),
    st.text(max_size=60),
)
CGROUP_FILE = st.one_of(
    st.lists(CGROUP_LINE, max_size=6).map("\n".join),
    st.text(),
)


@BOUNDED
@given(CGROUP_FILE)
def test_cgroup_files(text: str) -> None:
    with contextlib.suppress(CgroupFormatError):
        container_from_cgroup_file(text)


@BOUNDED
@given(st.one_of(CGROUP_PATH, st.text()))
def test_cgroup_paths_never_raise(path: str) -> None:
    ref = container_from_cgroup_path(path)
    assert ref is None or len(ref.container_id) == 64


# -- durations and settings -------------------------------------------------------------------

DURATION = st.one_of(
    st.text(),
    st.lists(
        st.builds(
            lambda number, unit: f"{number}{unit}",
            st.one_of(st.integers(0, 10**30).map(str), st.floats(0, 1e6).map(lambda f: f"{f:.3f}")),
            st.sampled_from(["ms", "s", "m", "h", "d", "w", "y", "", "x"]),
        ),
        max_size=4,
    ).map("".join),
)


@BOUNDED
@given(DURATION)
def test_durations(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except DurationError:
        return
    assert seconds >= 0
    if seconds < 10**12:
        format_duration(seconds)  # anything read can be written back


SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    DURATION,
)
NAMES = [setting.name for setting in config.SETTINGS]


@BOUNDED
@given(
    st.dictionaries(
        st.sampled_from([s.attribute for s in config.SETTINGS if s.name != "config.file"]),
        st.text(max_size=60),
        max_size=5,
    )
)
def test_settings_from_flags_and_environment(flags: dict[str, str]) -> None:
    environ = (
        {config.SETTINGS[0].env: flags.pop("listen_address")} if "listen_address" in flags else {}
    )
    with contextlib.suppress(config.ConfigError):
        config.load(flags, environ)


def _nested(name: str, value: object) -> dict[str, Any]:
    head, _, rest = name.partition(".")
    return {head: _nested(rest, value) if rest else value}


YAML_DOCUMENT = st.one_of(
    st.text(),
    st.recursive(
        SCALAR,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(
                st.one_of(st.sampled_from(NAMES), st.text(max_size=8), st.integers()),
                inner,
                max_size=3,
            ),
        ),
        max_leaves=12,
    ).map(yaml.safe_dump),
    st.lists(st.tuples(st.sampled_from(NAMES), SCALAR), max_size=4).map(
        lambda pairs: yaml.safe_dump(
            next(_nested(name, value) for name, value in pairs) if pairs else {}
        )
    ),
    st.integers(1, 600).map(lambda depth: "a: " + "[" * depth + "]" * depth),
)


@settings(BOUNDED, max_examples=100)  # a file per example
@given(YAML_DOCUMENT)
def test_settings_from_a_yaml_file(document: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "gpuscope.yaml"
        path.write_text(document, encoding="utf-8", errors="surrogatepass")
        with contextlib.suppress(config.ConfigError):
            config.load({"config_file": str(path)}, {})


# -- calibration profiles ---------------------------------------------------------------------

JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
VALID_PROFILE = json.loads(dump_profile(gpu_profile()))


def _mutated(document: dict[str, Any], path: list[str], value: object) -> dict[str, Any]:
    """The valid profile with one field (found by walking `path` as far as it goes) replaced."""
    copy = json.loads(json.dumps(document))
    node: Any = copy
    for key in path[:-1]:
        if isinstance(node, dict) and isinstance(node.get(key), dict):
            node = node[key]
    if isinstance(node, dict) and path:
        node[path[-1]] = value
    return copy


PROFILE_KEYS = st.sampled_from(
    sorted(
        {
            *VALID_PROFILE,
            "value",
            "unit",
            "min",
            "max",
            "trials",
            "bf16",
            "fp32",
            "copy",
            "eager",
            "before",
            "skipped",
            "size",
            "datasheet",
        }
    )
)


@BOUNDED
@given(
    st.one_of(
        JSONISH,
        st.builds(
            _mutated,
            st.just(VALID_PROFILE),
            st.lists(PROFILE_KEYS, min_size=1, max_size=4),
            JSONISH,
        ),
    )
)
def test_profile_documents(document: object) -> None:
    with contextlib.suppress(ProfileError):
        parse_profile(document, source="fuzz")


@BOUNDED
@given(
    st.one_of(
        st.text(),
        st.binary(),
        JSONISH.map(json.dumps),
        JSONISH.map(yaml.safe_dump),
        st.just(dump_profile(gpu_profile())).flatmap(
            lambda valid: st.integers(0, len(valid)).map(lambda cut: valid[:cut])
        ),
    ),
    st.sampled_from([None, "json", "yaml"]),
)
def test_profile_texts(text: str | bytes, fmt: Any) -> None:
    with contextlib.suppress(ProfileError):
        parse_profile_text(text, source="fuzz", fmt=fmt)


# -- the web config ---------------------------------------------------------------------------

WEB_KEYS = {
    **{section: list(keys) for section, keys in SECTION_KEYS.items()},
    "basic_auth_users": ["alice", "bob:x", ""],
}
WEB_VALUE = st.one_of(
    SCALAR,
    st.sampled_from(
        [
            "NoClientCert",
            "VerifyClientCertIfGiven",
            "RequireAndVerifyClientCert",
            "RequestClientCert",
            "TLS12",
            "TLS13",
            "TLS10",
            "100ms",
            "0",
            "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
            "$2b$10$laMuVCNilHXuVdop5.sJdOvvrCKFdT1GcJT2rlglGvh/yvhfNTi.u",
            "$2b$99$laMuVCNilHXuVdop5.sJdOvvrCKFdT1GcJT2rlglGvh/yvhfNTi.u",
            "nosniff",
            "deny",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        ]
    ),
    st.lists(st.one_of(st.text(max_size=10), st.integers()), max_size=3),
    st.dictionaries(
        st.sampled_from(
            ["X-Frame-Options", "X-Content-Type-Options", "Server", "Content-Security-Policy"]
        ),
        st.one_of(st.text(max_size=10), st.none()),
        max_size=3,
    ),
)
WEB_SECTION = st.sampled_from(sorted(WEB_KEYS)).flatmap(
    lambda section: st.dictionaries(st.sampled_from(WEB_KEYS[section]), WEB_VALUE, max_size=5).map(
        lambda body: (section, body)
    )
)
WEB_DOCUMENT = st.one_of(
    st.lists(WEB_SECTION, max_size=4).map(lambda sections: yaml.safe_dump(dict(sections))),
    JSONISH.map(yaml.safe_dump),
    st.text(),
    st.binary(),
)


@BOUNDED
@given(WEB_DOCUMENT)
def test_web_configs(text: str | bytes) -> None:
    with contextlib.suppress(WebConfigError):
        parse_web_config(text, directory=Path("/etc/gpuscope/web"))


# -- HTTP requests ----------------------------------------------------------------------------

HTTP_FIELD = st.one_of(
    st.sampled_from(
        [
            b"Host: x",
            b"Host: y",
            b"Content-Length: 3",
            b"Content-Length: 0",
            b"Content-Length: 1, 1",
            b"Content-Length: +1",
            b"Content-Length: 70000",
            b"Transfer-Encoding: chunked",
            b"Transfer-Encoding: gzip, chunked",
            b"Connection: close",
            b"Connection: keep-alive",
            b"Connection: upgrade",
            b"Upgrade: h2c",
            b"Expect: 100-continue",
            b"X: a\tb ",
            b"X: \xe9",
            b"X: a\x01",
            b"X : a",
            b" folded",
            b"X: " + b"a" * 5000,
        ]
    ),
    st.builds(
        lambda name, value: name + b":" + value, st.binary(max_size=6), st.binary(max_size=6)
    ),
)
HTTP_BODY = st.one_of(
    st.sampled_from(
        [
            b"",
            b"abc",
            b"3\r\nabc\r\n0\r\n\r\n",
            b"3;e=1\r\nabc\r\n0\r\nT: t\r\n\r\n",
            b"3\r\nabcd\r\n0\r\n\r\n",
            b"10001\r\n",
            b"zz\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
    ),
    st.binary(max_size=12),
)
HTTP_LINE_END = st.sampled_from([b"\r\n"] * 6 + [b"\n", b"\r", b""])
HTTP_REQUEST = st.builds(
    lambda method, target, version, space, ends, fields, body: (
        method
        + space
        + target
        + (space + version if version else b"")
        + ends[0]
        + b"".join(field + end for field, end in zip(fields, ends[1:] * len(fields), strict=False))
        + b"\r\n"
        + body
    ),
    st.sampled_from([b"GET", b"HEAD", b"POST", b"get", b"G(T", b"PRI", b"CONNECT"]),
    st.sampled_from(
        [b"/", b"/metrics?x=1", b"*", b"http://h/-/ready", b"h:443", b"/\xe9", b"/a b"]
    ),
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.2", b""]),
    st.sampled_from([b" ", b" ", b"  ", b"\t"]),
    st.lists(HTTP_LINE_END, min_size=2, max_size=2),
    st.lists(HTTP_FIELD, max_size=5),
    HTTP_BODY,
)
HTTP_BYTES = st.one_of(
    HTTP_REQUEST,
    st.builds(
        lambda request, at, insert, cut: request[:at] + insert + request[at + cut :],
        HTTP_REQUEST,
        st.integers(0, 120),
        st.binary(max_size=3),
        st.integers(0, 2),
    ),
    st.lists(HTTP_REQUEST, min_size=2, max_size=3).map(b"".join),  # pipelined
    st.binary(max_size=200),
)
REFUSALS = {400, 413, 501, 505}


def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    pieces = []
    while data:
        size = rng.randint(1, 40)
        pieces.append(data[:size])
        data = data[size:]
    return pieces


def _read_requests(pieces: Iterable[bytes]) -> tuple[list[tuple[object, ...]], int, bytes]:
    """The requests read off `pieces` as the listener reads them (each request's head, read
    whole with its body), the status of the refusal reading ended in (0: none), and the bytes
    left unread (none after a request that closes the connection)."""
    reader = RequestReader()
    buffer = bytearray()
    read: list[tuple[object, ...]] = []
    request = None
    try:
        for piece in pieces:
            buffer += piece
            while buffer:
                if request is None:
                    request = reader.head(buffer)
                    if request is None:
                        break
                if not reader.body(buffer):
                    break
                read.append(
                    (
                        request.method,
                        request.path,
                        request.query,
                        request.version,
                        dict(request.headers),
                        request.keep_alive,
                        request.body,
                    )
                )
                if not request.keep_alive:
                    return read, 0, b""  # the listener reads no further
                request = None
    except BadRequest as refusal:
        return read, refusal.status, b""
    return read, 0, bytes(buffer)


@BOUNDED
@given(HTTP_BYTES, st.randoms(use_true_random=False))
def test_http_requests(data: bytes, rng: random.Random) -> None:
    """Whatever the bytes, reading raises nothing but `BadRequest`, and the same bytes in pieces
    read as they do whole. (Which refusal may differ: a limit is applied as soon as the bytes
    show it, so an over-long line arriving in pieces is refused before llhttp reaches a later
    mistake it would name when the line came whole.)"""
    whole_read, whole_refused, whole_left = _read_requests([data])
    read, refused, left = _read_requests(_pieces(data, rng))
    assert (read, bool(refused), left) == (whole_read, bool(whole_refused), whole_left)
    assert {refused, whole_refused} <= {0} | REFUSALS


async def _answered(port: int, pieces: list[bytes]) -> bytes:
    """Send `pieces` one by one, half-close, read until the listener closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0)
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


def test_the_listener_survives_any_bytes() -> None:
    """The listener's protocol over a real socket: no exception reaches the event loop, every
    answer is a status the listener gives, and a good request is answered after it all."""

    async def ok(_request: Request) -> Response:
        return Response.text("ok\n")

    loop = asyncio.new_event_loop()
    raised: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: raised.append(context))
    listener = Listener(routed({"/": ok, "/metrics": ok}), Connections())
    loop.run_until_complete(listener.start("127.0.0.1", 0))
    port = listener.addresses[0][1]

    @settings(BOUNDED, max_examples=100)
    @given(HTTP_BYTES, st.randoms(use_true_random=False))
    def exchange(data: bytes, rng: random.Random) -> None:
        answer = loop.run_until_complete(_answered(port, _pieces(data, rng)))
        assert raised == []
        statuses = {int(s) for s in re.findall(rb"^HTTP/1\.1 (\d{3}) ", answer, re.MULTILINE)}
        assert statuses <= {100, 200, 404, 405, 417} | REFUSALS, answer[:300]

    try:
        exchange()
        good = loop.run_until_complete(
            _answered(port, [b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"])
        )
        assert good.startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        loop.run_until_complete(listener.stop(1.0))
        loop.close()
