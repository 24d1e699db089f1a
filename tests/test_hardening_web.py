"""The endpoint against hostile and careless clients: `gpuscope serve` as a subprocess on a loopback
port, attacked the way the second hardening round's issue found it wanting.

Each test bounds its own load (threads stop by themselves after a few seconds) and asserts what a
legitimate client — Prometheus, the kubelet's probes — still gets, and what reaches the log.
"""

from __future__ import annotations

import base64
import contextlib
import random
import resource
import socket
import string
import struct
import subprocess
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import bcrypt
import pytest
import trustme

from exporter.web.server import MAX_CONNECTIONS, SPARE_FILES
from tests.helpers import (
    ROOT,
    Daemon,
    daemon_command,
    eventually,
    running_daemon,
    unavailable,
    value,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow

PASSWORD = "correct horse"
CREDENTIALS = base64.b64encode(f"prometheus:{PASSWORD}".encode())
AUTHORIZATION = b"Authorization: Basic " + CREDENTIALS
FLOOD_SECONDS = 10.0
ATTACKERS = 41
"""One more than the default --web.max-requests."""


def scrape(daemon: Daemon, credentials: bytes | None = None) -> str:
    """/metrics, with these basic-auth credentials if given."""
    head = AUTHORIZATION + b"\r\n" if credentials else b""
    status, body = request(daemon.port, b"/metrics", head)
    assert status == 200, body
    return body.decode()


@contextlib.contextmanager
def serving(*args: str, preexec: Callable[[], None] | None = None) -> Iterator[Daemon]:
    """`gpuscope serve --simulate=1 ARGS`, ready, every byte it writes kept."""
    with running_daemon("--simulate=1", *args, preexec=preexec) as daemon:
        daemon.wait_ready()
        yield daemon


def exchange(port: int, data: bytes, *, source: str = "127.0.0.1", timeout: float = 10) -> bytes:
    """Send `data` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout, (source, 0)) as connection:
        connection.sendall(data)
        answer = bytearray()
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(65536):
                answer.extend(chunk)
    return bytes(answer)


def request(
    port: int, path: bytes, headers: bytes = b"", *, source: str = "127.0.0.1"
) -> tuple[int, bytes]:
    """GET `path` on a new connection: (status, body); status 0 when nothing came back."""
    answer = exchange(
        port,
        b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n",
        source=source,
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    fields = head.split(b" ", 2)
    return (int(fields[1]) if len(fields) > 1 else 0), body


def reset_after_asking(port: int, path: bytes, headers: bytes, *, source: str) -> None:
    """Ask, read the first bytes of the answer, and reset the connection (SO_LINGER 0)."""
    with socket.create_connection(("127.0.0.1", port), 10, (source, 0)) as connection:
        connection.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        with contextlib.suppress(OSError):
            connection.recv(16)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def basic_auth_config(tmp_path: Path, extra: str = "", *, cost: int = 4) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(cost)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users: {{prometheus: '{hashed}'}}\n{extra}")
    return path


# -- 1. a flood of wrong credentials ------------------------------------------------------------


def _guess() -> bytes:
    user = "".join(random.choices(string.ascii_lowercase, k=8))
    password = "".join(random.choices(string.ascii_letters, k=12))
    token = base64.b64encode(f"{user}:{password}".encode())
    return b"Authorization: Basic " + token + b"\r\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "rate_limit",
    ["", "rate_limit: {interval: 100ms, burst: 5}\n"],
    ids=["without_rate_limit", "with_rate_limit"],
)
def test_a_flood_of_wrong_credentials_does_not_lock_out_a_valid_client(
    tmp_path: Path, rate_limit: str
) -> None:
    """41 clients, each from an address of its own, guess user names and passwords, one
    connection per guess (every third one reset rather than closed); Prometheus, starting after
    them with credentials not yet cached, scrapes once a second: every scrape succeeds, and so
    does every probe, and the daemon writes not one line meanwhile."""
    config = basic_auth_config(tmp_path, rate_limit, cost=10)
    with serving(f"--web.config.file={config}", "--log.level=info") as run:
        stop = threading.Event()
        guessed: Counter[int] = Counter()
        logged = len(run.output())

        def guess(source: str) -> None:
            number = 0
            while not stop.is_set():
                number += 1
                if number % 3 == 0:
                    reset_after_asking(run.port, b"/metrics", _guess(), source=source)
                    continue
                status, _ = request(run.port, b"/metrics", _guess(), source=source)
                guessed[status] += 1
                stop.wait(0.02)

        attackers = [
            threading.Thread(target=guess, args=(f"127.0.0.{2 + number}",))
            for number in range(ATTACKERS)
        ]
        for thread in attackers:
            thread.start()
        scrapes: list[int] = []
        probes: list[int] = []
        try:
            time.sleep(1.0)  # the flood is on before Prometheus's first scrape
            deadline = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < deadline:
                scrapes.append(request(run.port, b"/metrics", AUTHORIZATION + b"\r\n")[0])
                probes.append(request(run.port, b"/-/healthy")[0])
                time.sleep(1.0)
        finally:
            stop.set()
            for thread in attackers:
                thread.join(15)
        assert scrapes == [200] * len(scrapes)
        assert probes == [200] * len(probes)
        assert set(guessed) <= {401, 429}, guessed
        assert sum(guessed.values()) > len(scrapes), "the flood ran"
        time.sleep(0.5)  # for the log to be read
        assert run.output()[logged:] == b""
        text = scrape(run, CREDENTIALS)
    assert value(text, "gpuscope_http_requests_refused_total", reason="busy") == 0


# -- 4, 6. malformed requests: counted, never logged ---------------------------------------------

MALFORMED = {
    "bare LF line endings": b"GET /metrics HTTP/1.1\nHost: x\n" + AUTHORIZATION + b"\nX: \x01\n\n",
    "a control character ending the value": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + AUTHORIZATION
    + b"\x01\r\n\r\n",
    "a space before the colon": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + AUTHORIZATION.replace(b":", b" :", 1)
    + b"\r\n\r\n",
    "a folded header": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + AUTHORIZATION
    + b"\r\n more\r\n\r\n",
    "a header line over 4 KiB": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + AUTHORIZATION
    + b"\r\nX-Long: "
    + b"a" * 5000
    + b"\r\n\r\n",
    "a credential over 4 KiB": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + AUTHORIZATION
    + b"A" * 5000
    + b"\r\n\r\n",
    "a bad Content-Length": b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    + AUTHORIZATION
    + b"\r\nContent-Length: abc\r\n\r\n",
}


def bad_requests(run: Daemon, credentials: bytes | None = None) -> float:
    return value(scrape(run, credentials), "gpuscope_http_bad_requests_total")


def assert_no_credentials(output: bytes) -> None:
    for secret in (CREDENTIALS, PASSWORD.encode(), b"prometheus:correct"):
        assert secret not in output
    assert b"level=error" not in output


@pytest.mark.timeout(60)
def test_malformed_requests_never_write_their_bytes_to_the_log(tmp_path: Path) -> None:
    config = basic_auth_config(tmp_path)
    with serving(f"--web.config.file={config}", "--log.level=debug") as run:
        for name, data in MALFORMED.items():
            assert exchange(run.port, data).startswith(b"HTTP/1.1 400 "), name
        time.sleep(0.5)  # for the log to be read
        assert_no_credentials(run.output())
        eventually(lambda: bad_requests(run, CREDENTIALS) >= len(MALFORMED), 10, "the count")
        assert bad_requests(run, CREDENTIALS) == len(MALFORMED)
        assert run.stop() == 0
    output = run.output()
    assert_no_credentials(output)
    assert output.count(b"malformed requests refused") == 1, "debug level, once a minute"


@pytest.mark.timeout(60)
def test_a_flood_of_malformed_requests_writes_nothing_to_the_log() -> None:
    with serving() as run:
        before = len(run.output())
        for _ in range(5000):
            exchange(run.port, b"GET /m\xc3\xa9trics HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)  # for the log to be read
        assert run.output()[before:] == b""
        eventually(lambda: bad_requests(run) == 5000, 10, "5,000 bad requests counted")


# -- 10. a request line without a version ----------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", [b"/metrics", b"/-/healthy"])
def test_a_request_without_an_http_version_gets_400(path: bytes) -> None:
    with serving() as run:
        answer = exchange(run.port, b"GET " + path + b"\r\n\r\n")
        status_line = answer.partition(b"\r\n")[0]
        assert status_line.split(b" ")[1] == b"400", answer[:200]
        assert b"gpu_up" not in answer
        assert b"ok" not in answer.partition(b"\r\n\r\n")[2]


# -- 11. the connection cap -----------------------------------------------------------------------


def _open_idle(port: int, count: int) -> list[socket.socket]:
    """`count` connections that never send a byte (the server may close the older ones)."""
    idle = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port), 10)
        idle.append(connection)
    return idle


def _raise_own_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY and hard < wanted:
        unavailable(f"the test needs {wanted} open files; ulimit -Hn is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def evicted(run: Daemon) -> float:
    return value(scrape(run), "gpuscope_http_connections_closed_total", reason="evicted")


@pytest.mark.timeout(120)
def test_idle_connections_past_the_cap_never_shut_out_the_probes() -> None:
    """4,200 connections that never send a byte, more than the cap: the probes and a scrape still
    get in, and the daemon holds no more than the cap."""
    count = MAX_CONNECTIONS + 104
    _raise_own_file_limit(count + 512)
    with serving() as run:
        idle = _open_idle(run.port, count)
        try:
            assert request(run.port, b"/-/healthy")[0] == 200
            assert request(run.port, b"/-/ready")[0] == 200
            eventually(lambda: evicted(run) >= count - MAX_CONNECTIONS, 10, "the evictions")
            text = scrape(run)
            assert value(text, "gpuscope_http_connections_max") == MAX_CONNECTIONS
            assert value(text, "gpuscope_http_connections_open") <= MAX_CONNECTIONS
        finally:
            for connection in idle:
                connection.close()


@pytest.mark.timeout(60)
def test_the_cap_shrinks_to_the_open_file_limit() -> None:
    """Under `ulimit -n 1024` the daemon cannot hold 4,096 connections: it lowers its cap to fit,
    says so once, and 1,100 idle connections still leave room for the probes."""
    limit = 1024

    def small_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    with serving(preexec=small_limit) as run:
        assert any("capped by the open-file limit" in line for line in run.log_lines)
        idle = _open_idle(run.port, 1100)
        try:
            assert request(run.port, b"/-/healthy")[0] == 200
            text = scrape(run)
            assert value(text, "gpuscope_http_connections_max") == limit - SPARE_FILES
        finally:
            for connection in idle:
                connection.close()


# -- 8, 9. one-line errors that quote nothing secret ---------------------------------------------


def _serve_fails(*args: str) -> tuple[int, list[str]]:
    result = subprocess.run(
        daemon_command("--simulate=1", *args),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=ROOT,
    )
    assert not result.stdout
    return result.returncode, result.stderr.strip().splitlines()


@pytest.mark.timeout(30)
def test_a_hash_written_as_the_user_name_is_never_printed(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users: {{'{hashed}': prometheus}}\n")
    status, lines = _serve_fails(f"--web.config.file={config}")
    assert status == 2
    assert lines == [
        (
            f"gpuscope: error: invalid --web.config.file {config}: basic_auth_users entry 1: not "
            "a bcrypt hash ($2b$10$ and 53 characters); the user name is a bcrypt hash: write "
            "user: hash"
        )
    ]
    secret = hashed[7:]  # the salt and the digest
    assert not any(secret[i : i + 6] in lines[0] for i in range(len(secret) - 5))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("address", ["999.1.1.1:80", "nonexistent.invalid:9461"])
def test_a_listen_address_that_does_not_resolve(address: str) -> None:
    status, lines = _serve_fails(f"--web.listen-address={address}")
    assert status == 2
    assert lines == [
        (
            f"gpuscope: error: cannot listen on {address}: the address does not resolve "
            "(name or service not known)"
        )
    ]


def _tls_key(path: Path) -> None:
    trustme.CA().issue_cert("localhost").private_key_pem.write_to_path(str(path))


def _binary(path: Path) -> None:
    path.write_bytes(random.randbytes(3000))


def _huge(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(2**30)  # sparse: a gibibyte of nothing


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_tls_key, "expected a mapping of clusters, contexts and users"),
        (_binary, "not UTF-8 text"),
        (_huge, "larger than 4 MiB (the limit)"),
    ],
    ids=["tls_key", "binary", "huge"],
)
def test_a_file_that_is_not_a_kubeconfig(
    tmp_path: Path, make: Callable[[Path], None], reason: str
) -> None:
    path = tmp_path / "kubeconfig"
    make(path)
    started = time.monotonic()
    status, lines = _serve_fails(f"--kubeconfig={path}", "--kubernetes.node-name=node-1")
    assert time.monotonic() - started < 20
    assert status == 2
    (line,) = lines
    assert line.startswith(f"gpuscope: error: invalid --kubeconfig: {path} is not a kubeconfig: ")
    assert reason in line
