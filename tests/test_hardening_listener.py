"""The listener against the third hardening round's findings: `gpuscope serve` as a subprocess,
attacked the way the adversarial pass found it wanting — TLS on a read-only root, idle TLS
connections, clients that reset, running out of file descriptors, pipelining clients that never
read, a distributed guess flood on the real user name, and web-config files that never answer.

Each test bounds its own load and asserts what a legitimate client — Prometheus, the kubelet's
probes — still gets, what the daemon's memory does, and what reaches the log.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import random
import resource
import signal
import socket
import ssl
import string
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import bcrypt
import pytest
import trustme

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
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
PASSWORD = "correct horse"
AUTHORIZATION = b"Authorization: Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode())


# -- helpers ------------------------------------------------------------------------------------


class Pki:
    """A server certificate and key on disk, and a client context that trusts them."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        certificate = self.ca.issue_cert("localhost", "127.0.0.1")
        self.cert = directory / "server.crt"
        self.key = directory / "server.key"
        certificate.cert_chain_pems[0].write_to_path(str(self.cert))
        certificate.private_key_pem.write_to_path(str(self.key))
        self.config = directory / "web.yml"
        self.config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")

    def client(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context

    def renew(self) -> bytes:
        """A new certificate in the same files, as cert-manager writes it; its DER."""
        certificate = self.ca.issue_cert("localhost", "127.0.0.1")
        certificate.cert_chain_pems[0].write_to_path(str(self.cert))
        certificate.private_key_pem.write_to_path(str(self.key))
        return ssl.PEM_cert_to_DER_cert(certificate.cert_chain_pems[0].bytes().decode())


def https(
    port: int, pki: Pki, path: bytes = b"/-/healthy", *, timeout: float = 10
) -> tuple[int, bytes, bytes]:
    """GET over TLS on a new connection: (status, body, the server certificate's DER)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout) as raw,
        pki.client().wrap_socket(raw, server_hostname="localhost") as connection,
    ):
        certificate = connection.getpeercert(binary_form=True) or b""
        connection.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = bytearray()
        with contextlib.suppress(ConnectionResetError, ssl.SSLError):
            while chunk := connection.recv(65536):
                answer.extend(chunk)
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    fields = head.split(b" ", 2)
    return (int(fields[1]) if len(fields) > 1 else 0), body, certificate


def http(
    port: int, path: bytes = b"/-/healthy", headers: bytes = b"", *, source: str = "127.0.0.1"
) -> int:
    """GET on a new plain connection: the status, 0 when nothing came back."""
    with socket.create_connection(("127.0.0.1", port), 10, (source, 0)) as connection:
        connection.sendall(
            b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"
        )
        answer = bytearray()
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(65536):
                answer.extend(chunk)
    fields = bytes(answer).split(b" ", 2)
    return int(fields[1]) if len(fields) > 1 else 0


def rss(pid: int) -> int:
    """Resident bytes of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def settled_rss(pid: int) -> int:
    """The process's RSS once it stopped moving (three readings 0.3 s apart within 1 MiB)."""
    readings = [rss(pid)]
    for _ in range(40):
        time.sleep(0.3)
        readings.append(rss(pid))
        if max(readings[-3:]) - min(readings[-3:]) < MiB and len(readings) >= 3:
            break
    return readings[-1]


def raise_own_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY and hard < wanted:
        unavailable(f"the test needs {wanted} open files; ulimit -Hn is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def log_lines_since(daemon: Daemon, start: int, *, levels: tuple[str, ...]) -> list[str]:
    return [
        line for line in daemon.log_lines[start:] if any(f"level={lvl}" in line for lvl in levels)
    ]


LOUD = ("info", "warning", "warn", "error", "critical")


# -- 1. TLS on a read-only root ------------------------------------------------------------------

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY = 1
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MOUNT_FLAGS = {
    "nosuid": 2,
    "nodev": 4,
    "noexec": 8,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}
_SKIPPED_MOUNTS = ("/proc", "/sys", "/dev")
"""Kernel file systems the chart's pod has too; every other mount is made read-only."""


def _read_only_root() -> None:
    """In the child before exec: a mount namespace of its own (inside a user namespace of its own
    where a mount namespace alone is not allowed: not root, or root without CAP_SYS_ADMIN in a
    container) where `/`, `/tmp` and every other file system but /proc, /sys and /dev are
    read-only — stricter than the chart's `readOnlyRootFilesystem: true`, which leaves nothing
    writable at /tmp either. Raises OSError where namespaces are not allowed at all."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWNS) != 0:
        if libc.unshare(_CLONE_NEWNS | _CLONE_NEWUSER) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point, options = line.split()[4:6]
        if any(point == skip or point.startswith(skip + "/") for skip in _SKIPPED_MOUNTS):
            continue
        # A remount must keep the flags it has (a user namespace may not clear locked ones).
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        for option in options.split(","):
            flags |= _MOUNT_FLAGS.get(option, 0)
        if libc.mount(None, point.encode(), None, flags, None) != 0 and point == "/":
            raise OSError(ctypes.get_errno(), "mount -o remount,bind,ro /")


def _read_only_root_works() -> None:
    """Skip (fail under CI=true) where this machine cannot make a read-only root for a child;
    fail if it can but the root it made is not read-only after all."""
    probe = (
        "import tempfile\n"
        "try:\n    tempfile.mkstemp()\nexcept OSError as error:\n    print(error)\n"
        "else:\n    print('writable')\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", probe],
            preexec_fn=_read_only_root,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={key: value for key, value in os.environ.items() if key != "TMPDIR"},
        )
    except subprocess.SubprocessError as error:
        unavailable(f"cannot make a read-only root here (mount or user namespaces): {error}")
    assert "No usable temporary directory found" in result.stdout, result.stdout + result.stderr


@pytest.mark.timeout(90)
def test_tls_starts_and_reloads_on_a_read_only_root(tmp_path: Path) -> None:
    """As the chart runs it: `/` and `/tmp` read-only. The daemon starts with TLS, serves it,
    and takes a renewed certificate — writing no key material anywhere (nowhere is writable)."""
    _read_only_root_works()
    pki = Pki(tmp_path)
    with running_daemon(
        "--simulate=1",
        f"--web.config.file={pki.config}",
        preexec=_read_only_root,
        env={"TMPDIR": ""},
    ) as daemon:
        eventually(lambda: https(daemon.port, pki)[0] == 200, 20, "a TLS probe answered")
        status, body, first = https(daemon.port, pki, b"/metrics")
        assert status == 200
        assert b"gpu_up{" in body
        renewed = pki.renew()
        assert renewed != first
        eventually(
            lambda: https(daemon.port, pki)[2] == renewed, 20, "the renewed certificate served"
        )
        assert daemon.stop() == 0
    assert not [line for line in daemon.log_lines if "level=error" in line], daemon.log_lines


# -- 2. idle TLS connections: bounded memory, given back -----------------------------------------

IDLE_TLS = 1500


def _open(port: int, count: int) -> list[socket.socket]:
    connections = []
    for _ in range(count):
        connections.append(socket.create_connection(("127.0.0.1", port), 10))
    return connections


def _handshaken(port: int, pki: Pki, count: int) -> list[ssl.SSLSocket]:
    """`count` connections that finish the TLS handshake, ask one probe each (keep-alive), and
    then send nothing."""
    context = pki.client()
    connections = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), 10)
        connection = context.wrap_socket(raw, server_hostname="localhost")
        connection.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := connection.recv(4096)):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        connections.append(connection)
    return connections


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["silent", "handshaken"])
def test_idle_tls_connections_cost_little_memory_and_give_it_back(
    tmp_path: Path, kind: str
) -> None:
    """1,500 TLS connections that send nothing (or nothing after one request) keep the daemon
    far below the chart's memory limit (the README's figure: benchmarks/idle_tls.py), and the
    memory comes back once they close. The bounds here have generous slack: a daemon under the
    test venv, on a machine shared with other tests."""
    raise_own_file_limit(IDLE_TLS + 512)
    pki = Pki(tmp_path)
    with running_daemon("--simulate=1", f"--web.config.file={pki.config}") as daemon:
        eventually(lambda: https(daemon.port, pki)[0] == 200, 20, "a TLS probe answered")
        for _ in range(5):
            https(daemon.port, pki, b"/metrics")
        start = settled_rss(daemon.process.pid)
        if kind == "silent":
            idle: list[socket.socket] = _open(daemon.port, IDLE_TLS)
        else:
            idle = list(_handshaken(daemon.port, pki, IDLE_TLS))
        try:
            assert https(daemon.port, pki)[0] == 200, "the probes still get in"
            loaded = settled_rss(daemon.process.pid)
        finally:
            for connection in idle:
                connection.close()
        assert loaded - start < 90 * MiB, f"{(loaded - start) / MiB:.0f} MiB for {kind} ones"
        eventually(
            lambda: (
                value(
                    https(daemon.port, pki, b"/metrics")[1].decode(),
                    "gpuscope_http_connections_open",
                )
                <= 2
            ),
            20,
            "the closed connections gone",
        )
        after = settled_rss(daemon.process.pid)
        assert after - start < 50 * MiB, f"{(after - start) / MiB:.0f} MiB kept after they closed"


@pytest.mark.timeout(120)
def test_tls_handshakes_count_against_the_cap_and_time_out(tmp_path: Path) -> None:
    """Silent TLS connections are connections like any: counted, evicted past the cap, and closed
    once the handshake deadline (10 s) passes."""
    pki = Pki(tmp_path)
    with running_daemon("--simulate=1", f"--web.config.file={pki.config}") as daemon:
        eventually(lambda: https(daemon.port, pki)[0] == 200, 20, "a TLS probe answered")
        silent = _open(daemon.port, 50)
        try:
            text = eventually(
                lambda: (
                    t
                    if value(
                        t := https(daemon.port, pki, b"/metrics")[1].decode(),
                        "gpuscope_http_connections_open",
                    )
                    >= 50
                    else None
                ),
                10,
                "the silent connections counted",
            )
            assert value(text, "gpuscope_http_connections_open") <= 52
            silent[0].settimeout(20)
            started = time.monotonic()
            assert silent[0].recv(1) == b"", "closed by the server"
            assert time.monotonic() - started < 15
        finally:
            for connection in silent:
                connection.close()


# -- 3. clients that reset ------------------------------------------------------------------------


def _reset(connection: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client killed mid-read does."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_clients_that_reset_write_nothing_to_the_log(tmp_path: Path, tls: bool) -> None:
    """200 clients reset after reading part of a response (a closing one, a keep-alive one, or
    before reading anything): not one line at info or above."""
    pki = Pki(tmp_path)
    args = [f"--web.config.file={pki.config}"] if tls else []
    with running_daemon("--simulate=1", "--log.level=info", *args) as daemon:
        if tls:
            eventually(lambda: https(daemon.port, pki)[0] == 200, 20, "a TLS probe answered")
        else:
            daemon.wait_ready()
        time.sleep(0.5)
        start = len(daemon.log_lines)
        context = pki.client()
        for number in range(200):
            raw = socket.create_connection(("127.0.0.1", daemon.port), 10)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            connection: socket.socket = (
                context.wrap_socket(raw, server_hostname="localhost") if tls else raw
            )
            close = b"Connection: close\r\n" if number % 3 == 0 else b""
            connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n")
            if number % 3 != 2:
                connection.recv(100)
            _reset(connection)
        time.sleep(1.5)  # what would be logged, is
        assert (https(daemon.port, pki)[0] if tls else http(daemon.port)) == 200
        assert log_lines_since(daemon, start, levels=LOUD) == []
        assert daemon.stop() == 0


# -- 4. out of file descriptors --------------------------------------------------------------------


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(120)
def test_running_out_of_file_descriptors_logs_once_and_recovers() -> None:
    """The daemon's open-file limit drops below what it holds plus a few (as a tight `ulimit -n`
    does), then 3,000 connections arrive at once: accepting pauses and resumes with one log line,
    not a line per attempt, and once the burst goes a probe is answered at once."""
    raise_own_file_limit(4000)
    with running_daemon("--simulate=1", "--log.level=info") as daemon:
        daemon.wait_ready()
        pid = daemon.process.pid
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_files(pid) + 16, hard))
        start = len(daemon.log_lines)
        burst = []
        for _ in range(3000):
            connection = socket.socket()
            connection.setblocking(False)
            connection.connect_ex(("127.0.0.1", daemon.port))
            burst.append(connection)
        time.sleep(3.0)
        for connection in burst:
            _reset(connection)
        started = time.monotonic()
        eventually(lambda: http(daemon.port) == 200, 10, "a probe answered", every=0.02)
        waited = time.monotonic() - started
        lines = daemon.log_lines[start:]
        assert len(lines) <= 3, lines[:10]
        assert waited < 3.0, f"the probe waited {waited:.1f} s"
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
        assert daemon.stop() == 0


# -- 5. pipelining clients that never read -----------------------------------------------------


@pytest.mark.timeout(120)
def test_pipelining_clients_that_never_read_hold_no_request_slot() -> None:
    """40 connections (the default --web.max-requests) pipeline 200 scrapes each and never read:
    a new client is still served at once, scrape after scrape, and the daemon's memory stays
    flat."""
    with running_daemon("--simulate=1") as daemon:
        daemon.wait_ready()
        start = settled_rss(daemon.process.pid)
        stalled = []
        pipeline = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200
        for _ in range(40):
            connection = socket.socket()
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            connection.connect(("127.0.0.1", daemon.port))
            connection.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                connection.send(pipeline)
            stalled.append(connection)
        try:
            time.sleep(2.0)  # every stalled connection has a response it cannot write
            for _ in range(10):
                started = time.monotonic()
                assert http(daemon.port, b"/metrics") == 200
                assert time.monotonic() - started < 2.0
            assert settled_rss(daemon.process.pid) - start < 40 * MiB
        finally:
            for connection in stalled:
                connection.close()
        text = daemon.metrics()
        assert value(text, "gpuscope_http_requests_refused_total", reason="busy") == 0


# -- 6. a distributed guess flood on the real user name ---------------------------------------------


@pytest.mark.timeout(120)
def test_a_distributed_flood_on_the_real_user_name_leaves_room_for_the_real_scraper(
    tmp_path: Path,
) -> None:
    """40 addresses guess passwords for the configured user as fast as they are answered; the
    real scraper, from an address of its own with credentials not cached yet, gets its first
    check done within 3 s and at least four in five of its scrapes served while the flood
    lasts."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users: {{prometheus: '{hashed}'}}\n")
    with running_daemon("--simulate=1", f"--web.config.file={config}") as daemon:
        daemon.wait_ready()
        stop = threading.Event()
        guesses = [0]

        def guess(source: str) -> None:
            while not stop.is_set():
                password = "".join(random.choices(string.ascii_letters, k=12))
                token = base64.b64encode(f"prometheus:{password}".encode())
                with contextlib.suppress(OSError):  # shed after a wait, or slow: a guess lost
                    http(
                        daemon.port,
                        b"/metrics",
                        b"Authorization: Basic " + token + b"\r\n",
                        source=source,
                    )
                guesses[0] += 1

        attackers = [
            threading.Thread(target=guess, args=(f"127.0.0.{2 + number}",)) for number in range(40)
        ]
        for thread in attackers:
            thread.start()
        statuses: list[int] = []
        try:
            time.sleep(1.5)  # the flood is on before the scraper's first scrape
            started = time.monotonic()
            first_served = None
            for _ in range(25):
                status = http(daemon.port, b"/metrics", AUTHORIZATION + b"\r\n", source="127.0.1.1")
                statuses.append(status)
                if status == 200 and first_served is None:
                    first_served = time.monotonic() - started
                time.sleep(0.2)
        finally:
            stop.set()
            for thread in attackers:
                thread.join(15)
        assert guesses[0] > 200, "the flood ran"
        assert first_served is not None, statuses
        assert first_served < 3.0, statuses
        assert statuses.count(200) >= 20, statuses


# -- 7. web-config files that never answer ----------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_fifo_key_file_is_refused_and_later_configs_still_apply(tmp_path: Path) -> None:
    """A FIFO as `key_file`, then SIGHUP: one line, the previous config stays; a valid config
    applies on the next SIGHUP; SIGTERM stops the daemon at once."""
    pki = Pki(tmp_path)
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    with running_daemon("--simulate=1", f"--web.config.file={pki.config}") as daemon:
        eventually(lambda: https(daemon.port, pki)[0] == 200, 20, "a TLS probe answered")
        pki.config.write_text("tls_server_config: {cert_file: server.crt, key_file: fifo.key}\n")
        daemon.process.send_signal(signal.SIGHUP)
        rejected = eventually(
            lambda: next(
                (line for line in daemon.log_lines if "web config rejected" in line), None
            ),
            10,
            "the rejection",
        )
        assert "not a regular file (a FIFO)" in rejected
        assert https(daemon.port, pki)[0] == 200, "the previous config is in force"
        renewed = pki.renew()
        pki.config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
        daemon.process.send_signal(signal.SIGHUP)
        eventually(lambda: https(daemon.port, pki)[2] == renewed, 10, "the valid config applied")
        started = time.monotonic()
        assert daemon.stop(timeout=10) == 0
        assert time.monotonic() - started < 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["key_file", "cert_file"])
def test_a_fifo_web_config_file_at_start_exits_2_with_one_line(tmp_path: Path, name: str) -> None:
    pki = Pki(tmp_path)
    fifo = tmp_path / "fifo.pem"
    os.mkfifo(fifo)
    files = {"cert_file": "server.crt", "key_file": "server.key", name: "fifo.pem"}
    pki.config.write_text(
        f"tls_server_config: {{cert_file: {files['cert_file']}, key_file: {files['key_file']}}}\n"
    )
    result = subprocess.run(
        daemon_command("--simulate=1", f"--web.config.file={pki.config}"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        (
            f"gpuscope: error: invalid --web.config.file {pki.config}: tls_server_config.{name} "
            f"{fifo}: not a regular file (a FIFO)"
        )
    ]


_STUCK_READING = """
import sys, threading
import exporter.web.security as security

real = security.read_bounded
never = threading.Event()
readings = []

def read_bounded(path, limit):
    # A file on a mount that stopped answering: the first reading after start blocks for ever.
    readings.append(path)
    if len(readings) == 2:
        never.wait()
    return real(path, limit)

security.read_bounded = read_bounded
from exporter.cli import main
sys.exit(main())
"""


@pytest.mark.timeout(90)
def test_a_reading_that_never_returns_blocks_neither_later_reloads_nor_the_stop(
    tmp_path: Path,
) -> None:
    """A web config whose reading never returns (a hung network mount): SIGHUP; a later valid
    config still applies; SIGTERM stops the daemon at once."""
    pki = Pki(tmp_path)
    stuck = tmp_path / "stuck.yml"
    stuck.symlink_to(pki.config)
    command = [
        sys.executable,
        "-c",
        _STUCK_READING,
        "serve",
        "--simulate=1",
        f"--web.config.file={stuck}",
        "--web.listen-address=127.0.0.1:0",
    ]
    with _running(command) as daemon:
        eventually(lambda: https(daemon.port, pki)[0] == 200, 20, "a TLS probe answered")
        daemon.process.send_signal(signal.SIGHUP)  # the reading that never returns
        time.sleep(0.5)
        renewed = pki.renew()
        daemon.process.send_signal(signal.SIGHUP)
        eventually(
            lambda: https(daemon.port, pki)[2] == renewed,
            40,
            "a later config applied",
            detail=lambda: "\n".join(daemon.log_lines),
        )
        started = time.monotonic()
        daemon.process.send_signal(signal.SIGHUP)  # a reload under way at the stop
        assert daemon.stop(timeout=20) == 0
        assert time.monotonic() - started < 5


@contextlib.contextmanager
def _running(command: list[str]) -> Iterator[Daemon]:
    """`command` (a daemon started another way) as `running_daemon` runs `gpuscope serve`."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    daemon = Daemon(process, 0)

    def pump() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            daemon.log_lines.append(line)
            if not daemon.port and "msg=listening" in line:
                daemon.port = int(line.split("address=127.0.0.1:")[1].split()[0])

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    daemon.pumps = [reader]
    try:
        eventually(
            lambda: daemon.port,
            20,
            "the daemon listening",
            detail=lambda: "\n".join(daemon.log_lines),
        )
        yield daemon
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
