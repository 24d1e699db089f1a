"""A live stack on loopback: simulated gpuscope daemons scraped by a real Prometheus.

`gpuscope serve --simulate FLEET` per node, Debian's `prometheus` scraping them every second
with gpuscope's rule files loaded, a temporary data directory, and a small client for the HTTP
API. The dashboard tests run every panel query against it; the picture renderer draws from it.
A node without a fleet is a target nothing listens on (a daemon that is down).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import TracebackType

Json = dict[str, Any]

ROOT: Final = Path(__file__).resolve().parent.parent
RULE_FILES: Final = (ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml",)
JOB: Final = "gpuscope"


class StackError(RuntimeError):
    """A part of the live stack did not start or answer; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    """The `node` label Prometheus adds to the target's series."""
    fleet: Path | None
    """The simulated fleet, or None for a target that is down."""
    args: tuple[str, ...] = ()
    """Further `gpuscope serve` flags for this node."""
    cluster: Callable[[Path], AbstractContextManager[Sequence[str]]] | None = None
    """Stand-ins the node's daemon attributes pods from (API server, kubelet, procfs), started
    with the stack in a directory of their own; they give the daemon more flags."""
    opencost: tuple[float, bool] | None = None
    """OpenCost's price of one GPU on this node (USD per hour) and whether the node is spot,
    served by the stack's OpenCost stand-in; None: OpenCost does not list the node."""


def opencost_exposition(nodes: Sequence[Node]) -> bytes:
    """What OpenCost's /metrics says of these nodes: node_gpu_hourly_cost and
    kubecost_node_is_spot, with OpenCost's own `node` and `instance` labels."""
    lines = ["# TYPE node_gpu_hourly_cost gauge"]
    priced = [(node.name, *node.opencost) for node in nodes if node.opencost is not None]
    labels = 'node="{0}",instance="{0}",instance_type="p5.48xlarge",region="us-east-1"'
    lines += [
        f"node_gpu_hourly_cost{{{labels.format(name)}}} {price:g}" for name, price, _ in priced
    ]
    lines.append("# TYPE kubecost_node_is_spot gauge")
    lines += [
        f"kubecost_node_is_spot{{{labels.format(name)}}} {int(spot)}" for name, _, spot in priced
    ]
    return ("\n".join(lines) + "\n").encode()


@contextlib.contextmanager
def opencost_stand_in(nodes: Sequence[Node]) -> Iterator[str]:
    """An HTTP server on a free loopback port serving `opencost_exposition`, in a thread of its
    own until the context ends; yields its host:port."""
    body = opencost_exposition(nodes)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            # Prometheus scrapes it every second: nothing worth a line.
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="opencost-stand-in", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass(slots=True)
class Prometheus:
    """The few calls of Prometheus' HTTP API the checks need; answers are the API's JSON."""

    url: str

    def get(self, path: str, params: Sequence[tuple[str, str]] = ()) -> Json:
        query = urllib.parse.urlencode(list(params))
        request = f"{self.url}{path}?{query}" if query else f"{self.url}{path}"
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer: Json = json.load(response)
        except urllib.error.HTTPError as error:
            # Bad queries answer 400/422 with the API's own error JSON.
            answer = json.loads(error.read() or b"{}")
            answer.setdefault("status", "error")
            answer.setdefault("error", f"HTTP {error.code}")
        return answer

    def query(self, expr: str, *, at: float | None = None) -> Json:
        params = [("query", expr)]
        if at is not None:
            params.append(("time", f"{at:.3f}"))
        return self.get("/api/v1/query", params)

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> Json:
        return self.get(
            "/api/v1/query_range",
            [
                ("query", expr),
                ("start", f"{start:.3f}"),
                ("end", f"{end:.3f}"),
                ("step", f"{step:g}"),
            ],
        )

    def series(self, selector: str, *, start: float, end: float) -> Json:
        return self.get(
            "/api/v1/series",
            [("match[]", selector), ("start", f"{start:.3f}"), ("end", f"{end:.3f}")],
        )

    def alerts(self) -> list[Json]:
        answer = self.get("/api/v1/alerts")
        alerts: list[Json] = answer["data"]["alerts"]
        return alerts

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, None when it returns nothing."""
        result = self.query(expr).get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(
    what: str, ready: Callable[[], bool], timeout: float, log: Path | None = None
) -> None:
    """Until `ready()` is true (an OSError, ValueError or KeyError counts as not yet), or a
    StackError naming `what` with the last lines of `log` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if ready():
                return
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise StackError(f"{what} not ready after {timeout:.0f}s{tail}")


def answers(url: str) -> bool:
    """Whether `url` answers 200 (a readiness or health endpoint)."""
    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


@dataclass
class Processes:
    """Child processes started in order, each writing to its own log; `close` stops them in
    reverse order (SIGTERM, SIGKILL after 10 s)."""

    running: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, command: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
        self.running.append(process)
        return process

    def close(self) -> None:
        for process in reversed(self.running):
            if process.poll() is None:
                process.terminate()
        for process in self.running:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.running.clear()


def at_one_interval(rule_files: Sequence[Path], workdir: Path) -> list[Path]:
    """The rule files as a test stack loads them: every group at the stack's own evaluation
    interval. A group's `interval` (4 minutes for the daily rules) would leave a stack that
    evaluates every second without those series for minutes; the copies (in `workdir`) drop it.
    A file without such a group is loaded as it is."""
    loaded = []
    for number, path in enumerate(rule_files):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        groups = document.get("groups", [])
        if not any("interval" in group for group in groups):
            loaded.append(path)
            continue
        for group in groups:
            group.pop("interval", None)
        copy = workdir / f"at-one-interval-{number}-{path.name}"
        copy.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        loaded.append(copy)
    return loaded


@dataclass
class LiveStack:
    """Start with `with LiveStack(nodes, workdir) as stack:`; everything stops on exit."""

    nodes: Sequence[Node]
    workdir: Path
    rule_files: Sequence[Path] = RULE_FILES
    interval: str = "1s"
    prometheus_binary: str = field(
        default_factory=lambda: shutil.which("prometheus") or "/usr/bin/prometheus"
    )
    prometheus: Prometheus = field(init=False)
    ports: dict[str, int] = field(init=False, default_factory=dict)
    opencost: str | None = field(init=False, default=None)
    """host:port of the OpenCost stand-in, when a node has an OpenCost price."""
    _processes: Processes = field(init=False, default_factory=Processes)
    _stand_ins: ExitStack = field(init=False, default_factory=ExitStack)

    def __enter__(self) -> LiveStack:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            port = free_port()
            self.ports[node.name] = port
            if node.fleet is None:
                continue
            log = self.workdir / f"gpuscope-{node.name}.log"
            cluster = (
                self._stand_ins.enter_context(node.cluster(self.workdir / node.name))
                if node.cluster is not None
                else ()
            )
            self._processes.spawn(
                [
                    sys.executable,
                    "-m",
                    "exporter",
                    "serve",
                    f"--simulate={node.fleet}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--collect.interval={self.interval}",
                    *node.args,
                    *cluster,
                ],
                log,
            )
            wait_until(
                f"gpuscope for {node.name}",
                functools.partial(answers, f"http://127.0.0.1:{port}/-/ready"),
                30,
                log,
            )

        if any(node.opencost is not None for node in self.nodes):
            self.opencost = self._stand_ins.enter_context(opencost_stand_in(self.nodes))
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps(self.config(), indent=2), encoding="utf-8")
        port = free_port()
        log = self.workdir / "prometheus.log"
        self._processes.spawn(
            [
                self.prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log,
        )
        self.prometheus = Prometheus(f"http://127.0.0.1:{port}")
        wait_until("prometheus", lambda: answers(f"{self.prometheus.url}/-/ready"), 30, log)

    def config(self) -> Json:
        """prometheus.yml (JSON is YAML): one job, a `node` label per target, the rules loaded; the
        OpenCost stand-in's job when there is one."""
        return {
            "global": {
                "scrape_interval": self.interval,
                "scrape_timeout": self.interval,
                "evaluation_interval": self.interval,
            },
            "rule_files": [str(path) for path in at_one_interval(self.rule_files, self.workdir)],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{self.ports[node.name]}"],
                            "labels": {"node": node.name},
                        }
                        for node in self.nodes
                    ],
                },
                *(
                    # As OpenCost's docs scrape it: its own `node` and `instance` labels kept.
                    [
                        {
                            "job_name": "opencost",
                            "honor_labels": True,
                            "static_configs": [{"targets": [self.opencost]}],
                        }
                    ]
                    if self.opencost
                    else []
                ),
            ],
        }

    def wait_for_scrapes(self, count: int, *, timeout: float = 60.0) -> None:
        """Until every target has been scraped `count` times (the first takes about 6 s)."""
        expr = f'min(count_over_time(up{{job="{JOB}"}}[10m])) >= {count} and count(up{{job="{JOB}"}}) >= {len(self.nodes)}'
        wait_until(
            f"{count} scrapes of every target",
            lambda: self.prometheus.value(expr) is not None,
            timeout,
        )

    def _stop(self) -> None:
        self._processes.close()
        self._stand_ins.close()
