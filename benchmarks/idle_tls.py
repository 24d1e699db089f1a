"""Idle connections to the TLS port: the daemon's resident memory with them open and after they
close; prints one JSON document.

    .venv/bin/python benchmarks/idle_tls.py                       # 1,500 connections, 8 GPUs
    .venv/bin/python benchmarks/idle_tls.py --connections 4500    # past the cap (4,096)
    .venv/bin/python benchmarks/idle_tls.py --rounds 3            # flood after flood

The daemon (`benchmarks/runtime.py`'s runtime-only virtualenv, as the image ships it) serves
`--simulate 8` over TLS (a trustme certificate). Its start RSS is read once it answered a few
scrapes; then, for each kind of idle connection — `silent` (connected, never a byte: what the
adversarial pass flooded it with) and `handshaken` (a TLS handshake and one probe on each, then
nothing) — `--connections` of them are opened and held: the RSS while they are open (settled),
how long a TLS probe took meanwhile, and the RSS once they closed and the listener noticed (its
sweep hands freed pages back to the system after a flood), `--rounds` times over (what a flood
leaves behind must not pile up). Targets: under 160 MiB with 1,500 open, within 40 MiB of the
start once they close.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trustme

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import peak_rss_bytes, rss_bytes  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402

MIB = 2**20
TARGET_OPEN_MIB = 160
TARGET_RETURNED_MIB = 40


def get(port: int, context: ssl.SSLContext, path: bytes) -> tuple[float, bytes]:
    """One GET over a new TLS connection: seconds taken and the body."""
    started = time.perf_counter()
    with (
        socket.create_connection(("127.0.0.1", port), 30) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as connection,
    ):
        connection.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = bytearray()
        while chunk := connection.recv(65536):
            answer.extend(chunk)
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"{path.decode()} answered {head[:40]!r}")
    return time.perf_counter() - started, body


def open_connections(
    port: int, context: ssl.SSLContext, count: int, kind: str
) -> list[socket.socket]:
    held: list[socket.socket] = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), 30)
        if kind == "silent":
            held.append(raw)
            continue
        connection = context.wrap_socket(raw, server_hostname="localhost")
        connection.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += connection.recv(4096)
        held.append(connection)
    return held


def settled(pid: int) -> int:
    """RSS once three readings half a second apart agree within 1 MiB (or after 30 s)."""
    readings = [rss_bytes(pid)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.5)
        readings.append(rss_bytes(pid))
        if len(readings) >= 3 and max(readings[-3:]) - min(readings[-3:]) < MIB:
            break
    return readings[-1]


def open_count(port: int, context: ssl.SSLContext) -> float:
    _, body = get(port, context, b"/metrics")
    for line in body.decode().splitlines():
        if line.startswith("gpuscope_http_connections_open "):
            return float(line.split()[1])
    raise RuntimeError("no gpuscope_http_connections_open")


def measure(
    pid: int, port: int, context: ssl.SSLContext, count: int, kind: str
) -> dict[str, object]:
    before = settled(pid)
    held = open_connections(port, context, count, kind)
    try:
        probes = [get(port, context, b"/-/healthy")[0] for _ in range(20)]
        loaded = settled(pid)
        counted = open_count(port, context)
    finally:
        for connection in held:
            connection.close()
    deadline = time.monotonic() + 30
    while open_count(port, context) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3.0)  # the listener's sweep (every 2.5 s) trims the heap after a flood
    after = settled(pid)
    return {
        "connections": count,
        "counted_open": counted,
        "rss_before_mib": round(before / MIB, 1),
        "rss_open_mib": round(loaded / MIB, 1),
        "per_connection_kib": round((loaded - before) / count / 1024, 1),
        "probe_ms_median": round(statistics.median(probes) * 1000, 1),
        "probe_ms_max": round(max(probes) * 1000, 1),
        "rss_after_close_mib": round(after / MIB, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.connections + 512
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    ca = trustme.CA()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        certificate = ca.issue_cert("localhost")
        certificate.cert_chain_pems[0].write_to_path(str(directory / "server.crt"))
        certificate.private_key_pem.write_to_path(str(directory / "server.key"))
        config = directory / "web.yml"
        config.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
        context = ssl.create_default_context()
        ca.configure_trust(context)
        flags = [f"--simulate={args.gpus}", f"--web.config.file={config}"]
        with serving(flags, directory / "daemon.log") as (daemon, port):
            deadline = time.monotonic() + 30
            while True:
                try:
                    get(port, context, b"/-/ready")
                    break
                except (OSError, RuntimeError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            for _ in range(10):
                get(port, context, b"/metrics")
            start = settled(daemon.pid)
            rounds = [
                {
                    kind: measure(daemon.pid, port, context, args.connections, kind)
                    for kind in ("silent", "handshaken")
                }
                for _ in range(args.rounds)
            ]
            peak = peak_rss_bytes(daemon.pid)
            logged = [
                line
                for line in (directory / "daemon.log").read_text().splitlines()
                if "level=warn" in line or "level=error" in line
            ]
    kinds = [kind for found in rounds for kind in found.values()]
    worst_open = max(float(str(kind["rss_open_mib"])) for kind in kinds)
    worst_after = max(float(str(kind["rss_after_close_mib"])) for kind in kinds)
    print(
        json.dumps(
            {
                "gpus": args.gpus,
                "rss_start_mib": round(start / MIB, 1),
                "rss_peak_mib": round(peak / MIB, 1),
                **(rounds[0] if len(rounds) == 1 else {"rounds": rounds}),
                "target_open_mib": TARGET_OPEN_MIB,
                "target_returned_mib": TARGET_RETURNED_MIB,
                "open_within_target": worst_open < TARGET_OPEN_MIB,
                "returned_within_target": worst_after - start / MIB < TARGET_RETURNED_MIB,
                "warnings_and_errors_logged": logged,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
