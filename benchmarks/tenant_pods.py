"""Tenant pods as large as the API server takes, on the daemon's node: the daemon's peak resident
memory while it lists and watches them; prints one JSON document.

    .venv/bin/python benchmarks/tenant_pods.py                  # 35 pods x 1.4 MB of env
    .venv/bin/python benchmarks/tenant_pods.py --pods 100 --env-bytes 1500000

A pod need only name the node (`spec.nodeName`) to be in the daemon's list: it never has to run.
The stand-in API server (tests/fake_kube, in a process of its own so that its memory is not the
daemon's) serves `--pods` pods whose one container carries `--env-bytes` of `env` entries (small
ones, `--env-value` characters each: the more entries, the more a whole parse of them costs),
beside `--plain-pods` ordinary pods. `gpuscope serve --simulate 1` from the runtime-only
virtualenv (`benchmarks/runtime.py`) lists them, then every large pod is changed once through
the watch (a full copy of it in each event) and a last pod is added; once the daemon's
`gpuscope_pods_cached` counts that last pod, every event before it has been read.

Reported: the daemon's peak resident memory (VmHWM, the figure a memory limit kills at) and its
resident memory at the end, how long the list took, the list requests the stand-in saw (pages),
and the chart's memory limit the peak must stay under.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-in lives in tests/

from benchmarks.daemon import peak_rss_bytes, rss_bytes  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402
from tests.fake_kube.pods import NODE, pod, serve_pods  # noqa: E402
from tests.fake_kube.server import FakeKube  # noqa: E402

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

MIB = 2**20
TARGET_MIB = 150
CHART_LIMIT = ROOT / "helm" / "gpuscope" / "values.yaml"


def tenant_pod(n: int, env_bytes: int, value_chars: int) -> dict[str, Any]:
    """A pod on the node whose container carries about `env_bytes` of env entries."""
    document = pod(f"tenant-{n}", f"{n:08x}-0000-4000-8000-{n:012x}", namespace="tenant")
    entry = len(json.dumps({"name": "E000000", "value": "x" * value_chars}))
    document["spec"]["containers"][0]["env"] = [
        {"name": f"E{i:06d}", "value": f"{i:x}".rjust(value_chars, "x")}
        for i in range(env_bytes // (entry + 1))
    ]
    return document


def plain_pod(n: int) -> dict[str, Any]:
    return pod(f"plain-{n}", f"{n:08x}-0000-4000-8000-{n + 10**6:012x}")


def api_server(args: argparse.Namespace, scratch: Path, control: Connection) -> None:
    """The stand-in, in a process of its own: serves the pods, then on "churn" changes every
    large pod once and adds the last pod, and answers with the list requests it saw."""
    pods = [tenant_pod(n, args.env_bytes, args.env_value) for n in range(args.pods)]
    pods += [plain_pod(n) for n in range(args.plain_pods)]
    with serve_pods(FakeKube(), *pods) as api:
        control.send(str(api.write_kubeconfig(scratch / "kubeconfig")))
        while (command := control.recv()) != "stop":
            if command == "churn":
                for document in pods[: args.pods]:
                    document["metadata"]["labels"] = {"changed": "yes"}
                    api.put("pods", document)
                api.put("pods", plain_pod(args.plain_pods))
            lists = [q for q in api.requests if "/pods?" in q and "watch=true" not in q]
            control.send(lists)


def cached_pods(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(r"^gpuscope_pods_cached (\S+)$", text, re.MULTILINE)
    return int(float(match[1])) if match else None


def wait_for(port: int, pods: int, timeout: float) -> float:
    started = time.monotonic()
    while cached_pods(port) != pods:
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"the daemon did not cache {pods} pods within {timeout:g}s")
        time.sleep(0.1)
    return time.monotonic() - started


def chart_memory_limit() -> str:
    match = re.search(r"limits:\s*\n(?:\s+\w+:.*\n)*?\s+memory:\s*(\S+)", CHART_LIMIT.read_text())
    return match[1] if match else "?"


def run(args: argparse.Namespace) -> dict[str, object]:
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gpuscope-tenants-") as directory:
        scratch = Path(directory)
        ours, theirs = context.Pipe()
        server = context.Process(target=api_server, args=(args, scratch, theirs), daemon=True)
        server.start()
        try:
            kubeconfig = ours.recv()
            flags = [
                "--simulate=1",
                f"--kubeconfig={kubeconfig}",
                f"--kubernetes.node-name={NODE}",
                f"--kubelet.pod-resources-socket={scratch / 'absent.sock'}",
            ]
            with serving(flags, scratch / "daemon.log") as (daemon, port):
                total = args.pods + args.plain_pods
                list_seconds = wait_for(port, total, args.timeout)
                ours.send("churn")
                lists: list[str] = ours.recv()
                wait_for(port, total + 1, args.timeout)
                peak, resident = peak_rss_bytes(daemon.pid), rss_bytes(daemon.pid)
                log = (scratch / "daemon.log").read_text()
            ours.send("stop")
        finally:
            server.join(30)
            if server.is_alive():
                server.kill()
    return {
        "tenant_pods": args.pods,
        "env_bytes_per_pod": args.env_bytes,
        "env_value_chars": args.env_value,
        "plain_pods": args.plain_pods,
        "list_seconds": round(list_seconds, 2),
        "list_requests": len(lists),
        "list_queries": lists[:3],
        "peak_rss_mib": round(peak / MIB, 1),
        "rss_mib_at_end": round(resident / MIB, 1),
        "target_peak_mib": TARGET_MIB,
        "chart_memory_limit": chart_memory_limit(),
        "warnings_logged": [
            line for line in log.splitlines() if "level=warn" in line or "level=error" in line
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=35, help="large tenant pods on the node")
    parser.add_argument("--env-bytes", type=int, default=1_400_000, help="env JSON per pod")
    parser.add_argument("--env-value", type=int, default=4, help="characters per env value")
    parser.add_argument("--plain-pods", type=int, default=20, help="ordinary pods beside them")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a list")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
