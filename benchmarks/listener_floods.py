"""The listener's memory and room under connection floods (issue 27's adversarial pass); prints
one JSON document.

    .venv/bin/python benchmarks/listener_floods.py                      # all four, 4,096 each
    .venv/bin/python benchmarks/listener_floods.py half_open loris_tls  # some of them
    .venv/bin/python benchmarks/listener_floods.py --connections 1500 --rounds 3

Each flood runs against a fresh `gpuscope serve --simulate 8` (`benchmarks/runtime.py`'s
runtime-only virtualenv, as the image ships it) on loopback, with this machine's cores shared
between the daemon and the attacking client. The chart's limit is 192Mi, and the kubelet's
liveness probe (`/-/healthy`, a new connection, a 3 s timeout) may fail 3 times in a row.

- **half_open** (TLS): each connection sends a ClientHello and never answers the server's flight
  (no credentials needed): the RSS with them open, the peak, a TLS probe meanwhile, the RSS once
  they closed.
- **loris_plain**, **loris_tls**: each connection (TLS: after a handshake) sends 30 KB of a
  request head and never ends it; `--rounds` floods one after another: the RSS open, the peak,
  and once they closed.
- **stalled_cap** (plain, no web config): connections past the cap each pipeline `/metrics`
  requests with a 1 KiB receive buffer and never read, opened by two threads while a kubelet-like
  probe asks `/-/healthy` once a second for `--seconds`: the probes answered and failed, the
  longest run of failures, the peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import trustme

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import peak_rss_bytes, rss_bytes  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402

MIB = 2**20
LIMIT_MIB = 192
HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(
    b"X-%05d: %s\r\n" % (number, b"a" * 400) for number in range(73)
)
"""30 KB of a head that never ends (under the 32 KiB a head may have)."""


class Tls:
    """A certificate for the daemon and a client context that trusts it."""

    def __init__(self, directory: Path) -> None:
        ca = trustme.CA()
        certificate = ca.issue_cert("localhost")
        certificate.cert_chain_pems[0].write_to_path(str(directory / "server.crt"))
        certificate.private_key_pem.write_to_path(str(directory / "server.key"))
        self.config = directory / "web.yml"
        self.config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
        self.client = ssl.create_default_context()
        ca.configure_trust(self.client)


def probe(port: int, client: ssl.SSLContext | None, *, timeout: float = 3.0) -> float | None:
    """The kubelet's probe: /-/healthy on a new connection; seconds taken, None if not 200."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout) as raw:
            raw.settimeout(timeout)
            sock = client.wrap_socket(raw, server_hostname="localhost") if client else raw
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError:
        return None
    return time.perf_counter() - started if answer.startswith(b"HTTP/1.1 200 ") else None


def ready(port: int, client: ssl.SSLContext | None) -> None:
    deadline = time.monotonic() + 30
    while probe(port, client) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon never answered")
        time.sleep(0.1)
    time.sleep(2.0)  # a few sampling cycles: the start RSS settles


def settled(pid: int) -> int:
    """RSS once three readings half a second apart agree within 1 MiB (or after 20 s)."""
    readings = [rss_bytes(pid)]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.5)
        readings.append(rss_bytes(pid))
        if len(readings) >= 3 and max(readings[-3:]) - min(readings[-3:]) < MIB:
            break
    return readings[-1]


def hello(port: int, client: ssl.SSLContext) -> socket.socket:
    """A connection that sent a ClientHello and will never send more."""
    outgoing = ssl.MemoryBIO()
    session = client.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        session.do_handshake()
    sock = socket.create_connection(("127.0.0.1", port), 10)
    sock.sendall(outgoing.read())
    return sock


def loris(port: int, client: ssl.SSLContext | None) -> socket.socket:
    """A connection (TLS: handshaken) that sent 30 KB of a head and will never end it."""
    raw = socket.create_connection(("127.0.0.1", port), 10)
    sock = client.wrap_socket(raw, server_hostname="localhost") if client else raw
    sock.sendall(HEAD)
    return sock


def hold(
    pid: int, port: int, client: ssl.SSLContext | None, count: int, opener: str
) -> dict[str, object]:
    """Open `count` connections of one kind, measure, close them, measure again."""
    before = settled(pid)
    held: list[socket.socket] = []
    failed = 0
    started = time.monotonic()
    for _ in range(count):
        try:
            held.append(
                hello(port, client) if opener == "hello" and client else loris(port, client)
            )
        except OSError:  # closed by the listener before the client was done: what it is for
            failed += 1
    opened = time.monotonic() - started
    loaded = settled(pid)
    probes = [probe(port, client) for _ in range(10)]
    for sock in held:
        sock.close()
    time.sleep(4.0)  # the listener notices, and its sweep (every 2.5 s) trims the heap
    after = settled(pid)
    answered = [seconds for seconds in probes if seconds is not None]
    return {
        "connections": count,
        "refused_while_opening": failed,
        "opened_s": round(opened, 1),
        "rss_before_mib": round(before / MIB, 1),
        "rss_open_mib": round(loaded / MIB, 1),
        "per_connection_kib": round((loaded - before) / count / 1024, 1),
        "probes_answered": f"{len(answered)}/{len(probes)}",
        "probe_ms_median": round(statistics.median(answered) * 1000, 1) if answered else None,
        "rss_after_close_mib": round(after / MIB, 1),
    }


def flood(directory: Path, *, tls: bool, opener: str, count: int, rounds: int) -> dict[str, object]:
    certificates = Tls(directory)
    flags = ["--simulate=8"] + ([f"--web.config.file={certificates.config}"] if tls else [])
    client = certificates.client if tls else None
    with serving(flags, directory / f"{opener}-{tls}.log") as (daemon, port):
        ready(port, client)
        start = rss_bytes(daemon.pid)
        found = [hold(daemon.pid, port, client, count, opener) for _ in range(rounds)]
        time.sleep(10.0)
        idle = settled(daemon.pid)
        peak = peak_rss_bytes(daemon.pid)
    return {
        "rss_start_mib": round(start / MIB, 1),
        **(found[0] if rounds == 1 else {"rounds": found}),
        "rss_peak_mib": round(peak / MIB, 1),
        "rss_idle_after_mib": round(idle / MIB, 1),
        "within_limit": peak / MIB < LIMIT_MIB,
    }


def half_open(directory: Path, count: int, rounds: int) -> dict[str, object]:
    return flood(directory, tls=True, opener="hello", count=count, rounds=rounds)


def loris_plain(directory: Path, count: int, rounds: int) -> dict[str, object]:
    return flood(directory, tls=False, opener="loris", count=count, rounds=rounds)


def loris_tls(directory: Path, count: int, rounds: int) -> dict[str, object]:
    return flood(directory, tls=True, opener="loris", count=count, rounds=rounds)


def stalled_cap(directory: Path, count: int, seconds: float) -> dict[str, object]:
    """Two threads keep `count` stalled readers open (each wave renewed after 31 s, past the
    listener's 30 s write deadline); a probe once a second meanwhile."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    with serving(["--simulate=8"], directory / "stalled.log") as (daemon, port):
        ready(port, None)
        start = rss_bytes(daemon.pid)
        stop = time.monotonic() + seconds
        opened = [0]

        def stall() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            sock.setblocking(False)  # noqa: FBT003 - socket's own signature
            with contextlib.suppress(BlockingIOError):
                for _ in range(16):
                    sock.send(request * 100)
            return sock

        def opener() -> None:
            while time.monotonic() < stop:
                wave = time.monotonic()
                mine = []
                while time.monotonic() < stop and len(mine) < count // 2:
                    try:
                        mine.append(stall())
                        opened[0] += 1
                    except OSError:
                        time.sleep(0.01)
                while time.monotonic() < min(stop, wave + 31):
                    time.sleep(0.2)
                for sock in mine:
                    sock.close()

        threads = [threading.Thread(target=opener, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(5.0)
        answered = failed = run = longest = 0
        while time.monotonic() < stop:
            if probe(port, None) is None:
                failed += 1
                run += 1
                longest = max(longest, run)
            else:
                answered += 1
                run = 0
            time.sleep(1.0)
        for thread in threads:
            thread.join()
        peak = peak_rss_bytes(daemon.pid)
    return {
        "connections": count,
        "seconds": seconds,
        "stalled_opened": opened[0],
        "probes_answered": answered,
        "probes_failed": failed,
        "longest_failing_run": longest,
        "rss_start_mib": round(start / MIB, 1),
        "rss_peak_mib": round(peak / MIB, 1),
        "within_limit": peak / MIB < LIMIT_MIB,
    }


HELD = {"half_open": half_open, "loris_plain": loris_plain, "loris_tls": loris_tls}
FLOODS = (*HELD, "stalled_cap")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("floods", nargs="*", help=f"any of {', '.join(FLOODS)} (default: all)")
    parser.add_argument("--connections", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=1, help="floods one after another")
    parser.add_argument("--seconds", type=float, default=60.0, help="stalled_cap's length")
    args = parser.parse_args()
    unknown = set(args.floods) - set(FLOODS)
    if unknown:
        parser.error(f"no such flood: {', '.join(sorted(unknown))}")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.connections * 2 + 512
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    found: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.floods or FLOODS:
            directory = Path(scratch) / name
            directory.mkdir()
            if name == "stalled_cap":
                found[name] = stalled_cap(directory, args.connections + 104, args.seconds)
            else:
                found[name] = HELD[name](directory, args.connections, args.rounds)
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
