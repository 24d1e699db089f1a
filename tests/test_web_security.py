"""The secured endpoint in-process: the application behind the guarded listener, with TLS from
trustme's throwaway CAs, reloaded while it serves."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import TYPE_CHECKING

import bcrypt
import pytest
import trustme
import yaml

from exporter.app import App
from exporter.config import ServeConfig
from exporter.simulator import SimulatedNvml, default_fleet
from exporter.web.auth import AUTH_RETRY_SECONDS, CredentialChecks
from exporter.web.http import Request, Response
from exporter.web.security import MAX_STUCK, FileWork, Stuck, WebSecurity
from exporter.web.server import Connections
from tests.helpers import daemon_command, eventually_async, running_daemon
from tests.served_app import AppClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

CONFIG = replace(ServeConfig(), collect_interval=0.1)
PASSWORD = "correct horse"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


class Server:
    """The daemon's app and listener on a loopback port, for one test."""

    def __init__(self, security: WebSecurity, port: int) -> None:
        self.security = security
        self.port = port

    async def request(
        self,
        path: str = "/metrics",
        *,
        headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP/1.1 request on a fresh connection (a plain client: no pooling to reason
        about)."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=context, server_hostname="localhost" if context else None
        )
        lines = [f"GET {path} HTTP/1.1", "Host: localhost", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = await reader.read()
        writer.close()
        if not raw:
            return 0, {}, b""  # the server ended the connection without an answer
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode().split("\r\n")
        found = dict(line.split(": ", 1) for line in header_lines)
        return int(status_line.split()[1]), found, body

    async def peer_certificate(self, context: ssl.SSLContext) -> bytes:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=context, server_hostname="localhost"
        )
        certificate = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return bytes(certificate)


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    started: list[AppClient] = []

    async def start(
        web_config: str | None,
        *,
        max_requests: int = 40,
        connections: Connections | None = None,
        extra_routes: dict[str, Callable[[Request], Awaitable[Response]]] | None = None,
    ) -> Server:
        path = None
        if web_config is not None:
            path = tmp_path / "web-config.yml"
            path.write_text(web_config)
        security = WebSecurity.load(path, max_requests=max_requests, connections=connections)
        app = App(CONFIG, SimulatedNvml(default_fleet(1)), security=security)
        app.routes.update(extra_routes or {})
        client = await AppClient(app).start()
        started.append(client)
        server = Server(security, client.port)
        for _ in range(200):
            if security.ssl_context is not None or (await server.request("/-/ready"))[0] == 200:
                break
            await asyncio.sleep(0.02)
        return server

    yield start
    for client in started:
        await client.close()


async def refused(server: Server, context: ssl.SSLContext) -> bool:
    """Whether the server refuses this client's handshake. Under TLS 1.3 the client learns that
    only when it reads: an alert, or the connection closing without an answer."""
    try:
        status, _, _ = await server.request(context=context)
    except (ssl.SSLError, ConnectionError):
        return True
    return status == 0


class Pki:
    """Certificates on disk, as a Secret mounts them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.server_ca = trustme.CA()
        self.client_ca = trustme.CA()
        self.issue_server(self.server_ca)
        self.client_ca.cert_pem.write_to_path(str(directory / "clients-ca.crt"))

    def issue_server(self, ca: trustme.CA) -> bytes:
        certificate = ca.issue_cert("localhost", "127.0.0.1")
        certificate.cert_chain_pems[0].write_to_path(str(self.directory / "server.crt"))
        certificate.private_key_pem.write_to_path(str(self.directory / "server.key"))
        return ssl.PEM_cert_to_DER_cert(certificate.cert_chain_pems[0].bytes().decode())

    def client(self, *, ca: trustme.CA | None = None, name: str = "prometheus") -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.server_ca.configure_trust(context)
        if ca is not None:
            ca.issue_cert(name).configure_cert(context)
        return context


TLS = "tls_server_config: {cert_file: server.crt, key_file: server.key}\n"
MTLS = (
    "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients-ca.crt\n"
)


async def test_basic_auth_guards_everything_but_the_health_probes(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(f"basic_auth_users: {{prometheus: '{HASH}'}}\n")
    status, headers, _ = await server.request()
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic")
    assert (await server.request(headers=basic("prometheus", "wrong")))[0] == 401
    assert (await server.request("/", headers=basic("prometheus", "wrong")))[0] == 401, "cached"
    status, headers, _ = await server.request(headers=basic("nobody", PASSWORD))
    assert (status, headers["Retry-After"]) == (429, "1"), "a new guess a second after a failure"
    await asyncio.sleep(AUTH_RETRY_SECONDS)
    assert (await server.request(headers=basic("nobody", PASSWORD)))[0] == 401
    await asyncio.sleep(AUTH_RETRY_SECONDS)
    status, _, body = await server.request(headers=basic("prometheus", PASSWORD))
    assert status == 200
    assert b"gpu_up{" in body
    assert (await server.request("/-/healthy"))[0] == 200
    assert (await server.request("/-/ready"))[0] == 200


async def test_a_password_is_checked_by_bcrypt_once(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    checks = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda *a: checks.append(1) or real(*a))
    server = await serve(f"basic_auth_users: {{prometheus: '{HASH}'}}\n")
    for _ in range(5):
        assert (await server.request(headers=basic("prometheus", PASSWORD)))[0] == 200
    assert len(checks) == 1


async def test_a_new_certificate_is_served_without_a_restart(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pki = Pki(tmp_path)
    server = await serve(TLS)
    first = await server.peer_certificate(pki.client())
    assert (await server.request(context=pki.client()))[0] == 200
    second = pki.issue_server(pki.server_ca)  # what cert-manager does before expiry
    assert second != first
    assert await asyncio.to_thread(server.security.changed)
    assert await server.security.reload(reason="test")
    assert await server.peer_certificate(pki.client()) == second
    assert (await server.request(context=pki.client()))[0] == 200
    # an HTTP client on the TLS port gets nothing
    assert (await server.request())[0] == 0


async def test_the_watcher_picks_up_a_changed_file(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pki = Pki(tmp_path)
    server = await serve(TLS)
    first = await server.peer_certificate(pki.client())
    pki.issue_server(pki.server_ca)
    for _ in range(100):
        if await server.peer_certificate(pki.client()) != first:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the new certificate was not served within 5 s")


async def test_client_certificates_and_a_ca_taken_away(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pki = Pki(tmp_path)
    server = await serve(MTLS)
    assert (await server.request(context=pki.client(ca=pki.client_ca)))[0] == 200
    status, _, _ = await server.request(context=pki.client())  # no client certificate
    assert status == 403
    assert (await server.request("/-/healthy", context=pki.client()))[0] == 200, "probes pass"
    assert await refused(server, pki.client(ca=trustme.CA()))
    # the clients' CA is replaced: certificates of the old one stop working at once
    new_ca = trustme.CA()
    new_ca.cert_pem.write_to_path(str(tmp_path / "clients-ca.crt"))
    assert await server.security.reload(reason="test")
    assert await refused(server, pki.client(ca=pki.client_ca))
    assert (await server.request(context=pki.client(ca=new_ca)))[0] == 200


async def test_allowed_sans(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pki = Pki(tmp_path)
    server = await serve(MTLS + "  client_allowed_sans: [prometheus]\n")
    assert (await server.request(context=pki.client(ca=pki.client_ca)))[0] == 200
    impostor = pki.client(ca=pki.client_ca, name="grafana")
    assert await refused(server, impostor)


async def test_a_bad_reload_keeps_the_config_in_force(serve, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    server = await serve(f"basic_auth_users: {{prometheus: '{HASH}'}}\n")
    config = tmp_path / "web-config.yml"
    config.write_text(f"basic_auth_users: {{prometheus: '{HASH}'\n")  # broken YAML
    with caplog.at_level(logging.ERROR, logger="exporter.web.security"):
        assert not await server.security.reload(reason="test")
    assert (await server.request(headers=basic("prometheus", PASSWORD)))[0] == 200
    assert (await server.request())[0] == 401
    (record,) = caplog.records
    assert record.getMessage() == "web config rejected; the previous one stays in force"
    assert HASH not in str(record.__dict__)
    assert not await asyncio.to_thread(server.security.changed), "each bad version: one line"
    config.write_text(TLS)
    assert not await server.security.reload(reason="test")
    assert "switching TLS on or off needs a restart" in caplog.records[-1].__dict__["error"]
    config.write_text("basic_auth_users: {}\n")
    assert await server.security.reload(reason="test")
    assert (await server.request())[0] == 200


async def test_headers_and_rate_limit(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(
        "http_server_config: {headers: {X-Frame-Options: deny}}\n"
        "rate_limit: {interval: 1h, burst: 2}\n"
    )
    status, headers, _ = await server.request()
    assert (status, headers["X-Frame-Options"]) == (200, "deny")
    assert (await server.request())[0] == 200
    assert (await server.request())[0] == 429
    assert (await server.request("/-/healthy"))[0] == 200


async def test_requests_beyond_max_requests_get_503(serve) -> None:  # type: ignore[no-untyped-def]
    gate = asyncio.Event()

    async def slow(_request: Request) -> Response:
        await gate.wait()
        return Response.text("done")

    server = await serve(None, max_requests=2, extra_routes={"/slow": slow})
    held = [asyncio.create_task(server.request("/slow")) for _ in range(2)]
    await asyncio.sleep(0.2)
    assert (await server.request())[0] == 503
    assert (await server.request("/-/healthy"))[0] == 200, "probes are never refused"
    gate.set()
    assert [(await task)[0] for task in held] == [200, 200]
    assert (await server.request())[0] == 200


async def test_a_slow_header_is_cut_off_and_others_are_served(serve) -> None:  # type: ignore[no-untyped-def]
    connections = Connections(header_seconds=0.3, limit=3)
    server = await serve(None, connections=connections)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    assert (await server.request())[0] == 200
    assert await asyncio.wait_for(reader.read(), 5) == b"", "closed by the server"
    assert connections.closed_slow == 1
    # more connections than the limit: the one idle longest makes room for each new one
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
    assert await asyncio.wait_for(idle[0][0].read(), 5) == b"", "the oldest idle one is closed"
    assert (await server.request("/-/healthy"))[0] == 200
    assert connections.evicted >= 2
    assert len(connections) <= connections.limit
    for _, idle_writer in idle:
        idle_writer.close()
    writer.close()


# -- the whole program -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "files", "message"),
    [
        (
            ["--web.config.file={dir}/web.yml"],
            {"web.yml": f"basic_auth_users: {{prometheus: '{HASH}'\n"},
            "invalid --web.config.file {dir}/web.yml: not valid YAML at line 2",
        ),
        (
            ["--web.config.file={dir}/web.yml"],
            {"web.yml": TLS},
            "invalid --web.config.file {dir}/web.yml: tls_server_config.cert_file {dir}/server.crt: cannot read it: No such file or directory",
        ),
        (
            ["--web.config.file={dir}/web.yml"],
            {"web.yml": "tls_server_config: {cert_file: /dev/urandom, key_file: /dev/zero}\n"},
            "invalid --web.config.file {dir}/web.yml: tls_server_config.cert_file /dev/urandom: not a regular file (a character device)",
        ),
        (
            ["--web.config.file={dir}/absent.yml"],
            {},
            "invalid --web.config.file: '{dir}/absent.yml' is not a readable file",
        ),
        (["--web.max-requests=-1"], {}, "invalid --web.max-requests: '-1' is not a whole number"),
    ],
)
def test_a_bad_web_config_at_start_exits_2_with_one_line(
    tmp_path: Path, args: list[str], files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = subprocess.run(
        daemon_command("--simulate=1", *(arg.format(dir=tmp_path) for arg in args)),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpuscope: error: {message.format(dir=tmp_path)}"
    ]
    assert HASH not in result.stderr


def test_the_daemon_serves_https_with_basic_auth(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    config = tmp_path / "web-config.yml"
    config.write_text(TLS + f"basic_auth_users: {{prometheus: '{HASH}'}}\n")
    with running_daemon("--simulate=1", f"--web.config.file={config}") as daemon:
        listening = next(line for line in daemon.log_lines if "msg=listening" in line)
        assert "tls=true" in listening
        assert "basic_auth_users=1" in listening
        context = pki.client()
        url = f"https://localhost:{daemon.port}"

        def get(path: str, headers: dict[str, str] | None = None) -> int:
            request = urllib.request.Request(url + path, headers=headers or {})
            try:
                with urllib.request.urlopen(request, timeout=10, context=context) as response:
                    return int(response.status)
            except urllib.error.HTTPError as error:
                return error.code

        for _ in range(100):
            if get("/-/ready") == 200:
                break
            time.sleep(0.05)
        assert get("/metrics") == 401
        assert get("/metrics", basic("prometheus", PASSWORD)) == 200
        assert get("/-/healthy") == 200


# -- hardening: stalled readers, fair credential checks, files that never answer -----------------

HUGE = bytes(16 * 2**20)  # more than the kernel's send buffer takes


async def test_a_client_that_stops_reading_holds_no_request_slot(serve) -> None:  # type: ignore[no-untyped-def]
    """Two clients (--web.max-requests=2) ask for a body larger than the kernel takes and never
    read: the next client is served at once, not refused 503."""

    async def huge(_request: Request) -> Response:
        return Response(body=HUGE)

    server = await serve(None, max_requests=2, extra_routes={"/huge": huge})
    stalled = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1024)
        writer.write(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")  # the answer began, and waits on this reader
        writer.transport.pause_reading()
        stalled.append(writer)
    await asyncio.sleep(0.3)
    for _ in range(3):
        assert (await server.request())[0] == 200
    assert server.security.counts().refused[-1] == ("busy", 0)
    for writer in stalled:
        writer.close()


class Gated:
    """A `BasicAuth` stand-in whose checks each wait until the test lets one finish: what order
    they ran in, and whether each was the right password."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self._go = threading.Semaphore(0)

    def knows(self, user: str) -> bool:
        return user == "prometheus"

    def verify(self, user: str, password: str) -> bool:
        self.ran.append(password)
        assert self._go.acquire(timeout=10)
        return password == PASSWORD

    def finish(self) -> None:
        self._go.release()


async def _under_way(checks: CredentialChecks, count: int) -> None:
    await eventually_async(lambda: len(checks) == count, 5, f"{count} checks under way")


async def test_credential_checks_serve_never_seen_addresses_first() -> None:
    """Checks from addresses not seen failing run before those of addresses that failed (the
    latest such first), one at a time."""
    auth = Gated()
    checks = CredentialChecks(size=8, retry_seconds=0)
    first = asyncio.create_task(checks.check("10.0.0.1", auth, "prometheus", "guess-1"))  # type: ignore[arg-type]
    await _under_way(checks, 1)
    auth.finish()
    assert await first is False  # 10.0.0.1 has now failed once
    await eventually_async(lambda: auth.ran == ["guess-1"], 5, "the first check")
    blocker = asyncio.create_task(checks.check("10.0.0.9", auth, "prometheus", "guess-9"))  # type: ignore[arg-type]
    await eventually_async(lambda: len(auth.ran) == 2, 5, "a check running")
    failed_again = asyncio.create_task(checks.check("10.0.0.1", auth, "prometheus", "guess-2"))  # type: ignore[arg-type]
    new_a = asyncio.create_task(checks.check("10.0.0.2", auth, "prometheus", "guess-3"))  # type: ignore[arg-type]
    new_b = asyncio.create_task(checks.check("10.0.0.3", auth, "prometheus", PASSWORD))  # type: ignore[arg-type]
    await _under_way(checks, 4)
    assert await checks.check("10.0.0.3", auth, "prometheus", "x") is None, "one per address"  # type: ignore[arg-type]
    for _ in range(4):
        auth.finish()
    assert [await t for t in (blocker, failed_again, new_a, new_b)] == [False, False, False, True]
    assert auth.ran == ["guess-1", "guess-9", PASSWORD, "guess-3", "guess-2"]
    checks.close()


async def test_credential_checks_when_full_a_new_address_takes_a_failed_ones_place() -> None:
    auth = Gated()
    checks = CredentialChecks(size=3, retry_seconds=0)
    for number in (1, 2):  # two addresses that fail once
        task = asyncio.create_task(checks.check(f"10.0.0.{number}", auth, "prometheus", "no"))  # type: ignore[arg-type]
        auth.finish()
        assert await task is False
    running = asyncio.create_task(checks.check("10.0.0.9", auth, "prometheus", "no"))  # type: ignore[arg-type]
    older = asyncio.create_task(checks.check("10.0.0.1", auth, "prometheus", "no"))  # type: ignore[arg-type]
    latest = asyncio.create_task(checks.check("10.0.0.2", auth, "prometheus", "no"))  # type: ignore[arg-type]
    await _under_way(checks, 3)
    real = asyncio.create_task(checks.check("10.0.0.5", auth, "prometheus", PASSWORD))  # type: ignore[arg-type]
    assert await latest is None, "shed for the address never seen failing"
    for _ in range(3):
        auth.finish()
    assert [await t for t in (running, real, older)] == [False, True, False]
    checks.close()


async def test_credential_checks_for_unknown_users_take_half_the_places_at_most() -> None:
    auth = Gated()
    checks = CredentialChecks(size=4)
    guesses = [
        asyncio.create_task(checks.check(f"10.0.0.{n}", auth, "nobody", "x"))  # type: ignore[arg-type]
        for n in (1, 2)
    ]
    await _under_way(checks, 2)
    assert await checks.check("10.0.0.3", auth, "nobody", "x") is None  # type: ignore[arg-type]
    real = asyncio.create_task(checks.check("10.0.0.4", auth, "prometheus", PASSWORD))  # type: ignore[arg-type]
    await _under_way(checks, 3)
    for _ in range(3):
        auth.finish()
    assert [await t for t in (*guesses, real)] == [False, False, True]
    checks.close()


async def test_a_credential_check_that_waits_too_long_is_shed() -> None:
    auth = Gated()
    checks = CredentialChecks(size=4, wait_seconds=0.2)
    running = asyncio.create_task(checks.check("10.0.0.1", auth, "prometheus", "no"))  # type: ignore[arg-type]
    await eventually_async(lambda: auth.ran, 5, "a check running")
    started = time.monotonic()
    assert await checks.check("10.0.0.2", auth, "prometheus", PASSWORD) is None  # type: ignore[arg-type]
    assert time.monotonic() - started < 2
    auth.finish()
    assert await running is False
    assert len(checks) == 0
    checks.close()


async def test_file_work_that_never_returns_is_abandoned_to_a_daemon_thread() -> None:
    """A job stuck for good (a hung mount): `Stuck` after the deadline, the next job runs on a
    thread of its own, at most MAX_STUCK threads are left, and none keeps the process alive."""
    never = threading.Event()
    work = FileWork(seconds=0.2)
    try:
        for stuck in range(1, MAX_STUCK + 1):
            with pytest.raises(Stuck, match=r"took over 0\.2 s"):
                await work.run(never.wait)
            if stuck < MAX_STUCK:
                assert await work.run(lambda: 42) == 42, "a later job still runs"
        with pytest.raises(Stuck, match="never returned"):
            await work.run(lambda: 42)
        threads = [t for t in threading.enumerate() if t.name == "gpuscope-web-files"]
        assert threads
        assert all(t.daemon for t in threads)
    finally:
        never.set()
        work.close()
    for _ in range(50):
        try:
            assert await work.run(lambda: 7) == 7
            break
        except Stuck:
            await asyncio.sleep(0.05)
    else:
        raise AssertionError("file work never recovered once the stuck jobs returned")


def test_tls_is_loaded_without_a_temporary_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No key material is written anywhere: the certificate and key (from files or inline) reach
    OpenSSL from memory, so TLS loads where nothing is writable."""

    def nowhere(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("a temporary file was made")

    for name in ("mkstemp", "NamedTemporaryFile", "TemporaryFile", "mkdtemp"):
        monkeypatch.setattr(tempfile, name, nowhere)
    Pki(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text(TLS)
    assert WebSecurity.load(config).ssl_context is not None
    certificate = trustme.CA().issue_cert("localhost")
    inline = tmp_path / "inline.yml"
    inline.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert": certificate.cert_chain_pems[0].bytes().decode(),
                    "key": certificate.private_key_pem.bytes().decode(),
                }
            }
        )
    )
    assert WebSecurity.load(inline).ssl_context is not None
