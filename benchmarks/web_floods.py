"""The listener under the third hardening round's floods; prints one JSON document.

    .venv/bin/python benchmarks/web_floods.py            # all four, about a minute
    .venv/bin/python benchmarks/web_floods.py fairness   # one of them

Each flood runs against a fresh `gpuscope serve --simulate 2` (`benchmarks/runtime.py`'s
runtime-only virtualenv) on loopback, with this machine's cores shared between the daemon and
the attacking clients:

- **resets**: 200 clients ask for /metrics (`Connection: close`, a 4 KiB receive buffer), read
  100 bytes and reset: the lines and bytes the daemon logs at info level and above.
- **descriptors**: the daemon's open-file limit is lowered to what it holds plus 16 (as a tight
  `ulimit -n` would), 3,000 connections arrive at once and stay 3 s, then reset: the lines
  logged, and how long a probe then waits.
- **stalled**: 40 connections (the default `--web.max-requests`) pipeline 200 scrapes each and
  never read (4 KiB receive buffers); meanwhile a new client scrapes 20 times: its statuses and
  latency, the `503`s counted, the daemon's RSS before and with them.
- **fairness**: basic auth at bcrypt cost 10; 40 addresses guess passwords for the configured
  user as fast as they are answered; 1.5 s later the real scraper, from an address of its own
  with credentials not cached yet, scrapes 25 times 0.2 s apart: when its first check was done,
  and how many of its scrapes were served.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import random
import resource
import socket
import statistics
import string
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import bcrypt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import rss_bytes  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402

MIB = 2**20
PASSWORD = "correct horse"
LOUD = ("level=info", "level=warn", "level=error")


def get(port: int, path: bytes = b"/-/healthy", headers: bytes = b"", source: str = "") -> int:
    """GET on a new connection: the status, 0 when nothing came back."""
    with socket.create_connection(("127.0.0.1", port), 10, (source or "127.0.0.1", 0)) as sock:
        sock.sendall(
            b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"
        )
        answer = bytearray()
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer.extend(chunk)
    fields = bytes(answer).split(b" ", 2)
    return int(fields[1]) if len(fields) > 1 else 0


def reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def ready(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError):
            if get(port, b"/-/ready") == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon never got ready")
        time.sleep(0.1)


def loud(log: Path, start: int) -> list[str]:
    lines = log.read_text().splitlines()[start:]
    return [line for line in lines if any(level in line for level in LOUD)]


def lines(log: Path) -> int:
    return len(log.read_text().splitlines())


def resets(directory: Path) -> dict[str, object]:
    log = directory / "resets.log"
    with serving(["--simulate=2"], log) as (_, port):
        ready(port)
        start = lines(log)
        for _ in range(200):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            sock.recv(100)
            reset(sock)
        time.sleep(1.0)
        logged = loud(log, start)
    return {"resets": 200, "lines_logged": len(logged), "bytes_logged": sum(map(len, logged))}


def descriptors(directory: Path) -> dict[str, object]:
    log = directory / "descriptors.log"
    with serving(["--simulate=2"], log) as (daemon, port):
        ready(port)
        pid = daemon.pid
        held = len(list(Path(f"/proc/{pid}/fd").iterdir()))
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (held + 16, hard))
        start = lines(log)
        burst = []
        for _ in range(3000):
            sock = socket.socket()
            sock.setblocking(False)  # noqa: FBT003 - socket's own signature
            sock.connect_ex(("127.0.0.1", port))
            burst.append(sock)
        time.sleep(3.0)
        for sock in burst:
            reset(sock)
        started = time.monotonic()
        waited: float | None = None
        while time.monotonic() - started < 60:
            with contextlib.suppress(OSError):
                if get(port) == 200:
                    waited = round(time.monotonic() - started, 3)
                    break
            time.sleep(0.01)
        logged = log.read_text().splitlines()[start:]
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (hard, hard))
    return {
        "open_file_limit": held + 16,
        "connections": 3000,
        "lines_logged": len(logged),
        "bytes_logged": sum(map(len, logged)),
        "log": logged[:3],
        "probe_wait_s": waited,
    }


def stalled(directory: Path) -> dict[str, object]:
    log = directory / "stalled.log"
    with serving(["--simulate=2"], log) as (daemon, port):
        ready(port)
        before = rss_bytes(daemon.pid)
        pipeline = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 200
        held = []
        for _ in range(40):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.setblocking(False)  # noqa: FBT003 - socket's own signature
            with contextlib.suppress(BlockingIOError):
                sock.send(pipeline)
            held.append(sock)
        time.sleep(2.0)
        statuses, latencies = [], []
        for _ in range(20):
            started = time.perf_counter()
            statuses.append(get(port, b"/metrics"))
            latencies.append(time.perf_counter() - started)
        during = rss_bytes(daemon.pid)
        for sock in held:
            sock.close()
        time.sleep(1.5)  # the counts are read once per sampling cycle
        with socket.create_connection(("127.0.0.1", port), 10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            text = b""
            while chunk := sock.recv(65536):
                text += chunk
    busy = next(
        float(line.split()[-1])
        for line in text.decode().splitlines()
        if line.startswith('gpuscope_http_requests_refused_total{reason="busy"}')
    )
    return {
        "stalled_connections": 40,
        "new_client_statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
        "new_client_ms_median": round(statistics.median(latencies) * 1000, 1),
        "new_client_ms_max": round(max(latencies) * 1000, 1),
        "refused_busy": busy,
        "rss_before_mib": round(before / MIB, 1),
        "rss_stalled_mib": round(during / MIB, 1),
    }


def fairness(directory: Path) -> dict[str, object]:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    config = directory / "web.yml"
    config.write_text(f"basic_auth_users: {{prometheus: '{hashed}'}}\n")
    token = base64.b64encode(f"prometheus:{PASSWORD}".encode())
    log = directory / "fairness.log"
    with serving(["--simulate=2", f"--web.config.file={config}"], log) as (_, port):
        ready(port)
        stop = threading.Event()
        guesses = [0]

        def guess(source: str) -> None:
            while not stop.is_set():
                password = "".join(random.choices(string.ascii_letters, k=12))
                wrong = base64.b64encode(f"prometheus:{password}".encode())
                with contextlib.suppress(OSError):
                    get(port, b"/metrics", b"Authorization: Basic " + wrong + b"\r\n", source)
                guesses[0] += 1

        attackers = [
            threading.Thread(target=guess, args=(f"127.0.0.{2 + n}",), daemon=True)
            for n in range(40)
        ]
        for thread in attackers:
            thread.start()
        time.sleep(1.5)
        started = time.monotonic()
        first = None
        statuses = []
        for _ in range(25):
            status = get(port, b"/metrics", b"Authorization: Basic " + token + b"\r\n", "127.0.1.1")
            statuses.append(status)
            if status == 200 and first is None:
                first = time.monotonic() - started
            time.sleep(0.2)
        stop.set()
        for thread in attackers:
            thread.join(15)
    return {
        "attacker_addresses": 40,
        "guesses": guesses[0],
        "first_served_s": None if first is None else round(first, 2),
        "served": statuses.count(200),
        "of": len(statuses),
        "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
    }


FLOODS = {"resets": resets, "descriptors": descriptors, "stalled": stalled, "fairness": fairness}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("floods", nargs="*", help=f"any of {', '.join(FLOODS)} (default: all)")
    args = parser.parse_args()
    unknown = set(args.floods) - set(FLOODS)
    if unknown:
        parser.error(f"no such flood: {', '.join(sorted(unknown))}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    with tempfile.TemporaryDirectory() as scratch:
        found = {name: FLOODS[name](Path(scratch)) for name in args.floods or FLOODS}
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
