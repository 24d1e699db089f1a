"""VictoriaMetrics on loopback: Debian's single-node server and `vmalert`, as dashboards/live.py
runs Prometheus.

`VictoriaMetrics` starts `victoria-metrics` on a free loopback port over a data directory of its
own; it answers the Prometheus HTTP API, so `VictoriaMetrics.api` is live.py's `Prometheus`
client with VictoriaMetrics' import calls added. Data gets in three ways: scraping (a Prometheus
config's `scrape_configs`, VictoriaMetrics' `-promscrape.config`), import of Prometheus' own
TSDB blocks (`import_blocks`: `vmctl prometheus`, so a promtool-backfilled history is the same
samples in both stores), or VictoriaMetrics' JSON-line import. `Vmalert` evaluates rule files
against it and writes the results back by remote write, as a user's deployment does; `replay`
evaluates them over past data (vmalert's replay mode) and fails on any rule error.
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import pty
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import yaml

from dashboards.live import (
    RULE_FILES,
    Json,
    Processes,
    Prometheus,
    StackError,
    answers,
    at_one_interval,
    free_port,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path
    from types import TracebackType

SERVER: Final = "victoria-metrics"
VMALERT: Final = "vmalert"
VMCTL: Final = "vmctl"
SERVER_FLAGS: Final = (
    # Imported history must be searchable as soon as it is in: no cached answers from before an
    # import, no holding back of the newest samples (the default waits 30 s for late ones).
    "-search.disableCache",
    "-search.latencyOffset=0s",
    # One sample per series and millisecond: an import sent twice stores nothing twice.
    "-dedup.minScrapeInterval=1ms",
    "-loggerLevel=WARN",
)


def binary(name: str) -> str:
    """The path of one of Debian's `victoria-metrics` package's commands."""
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin")
    if found is None:
        raise StackError(f"{name} is not installed (Debian's victoria-metrics package)")
    return found


def rfc3339(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class VictoriaMetricsApi(Prometheus):
    """live.py's Prometheus client (VictoriaMetrics answers the same queries) and the import and
    flush calls of VictoriaMetrics' own API."""

    def _post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        request = urllib.request.Request(
            f"{self.url}{path}", data=body, headers=headers or {}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()

    def import_series(self, series: Iterable[Json]) -> None:
        """VictoriaMetrics' JSON-line import: `{"metric": {"__name__": ..., labels},
        "values": [...], "timestamps": [unix milliseconds, ...]}` per series."""
        body = "".join(json.dumps(one, separators=(",", ":")) + "\n" for one in series)
        self._post("/api/v1/import", gzip.compress(body.encode()), {"Content-Encoding": "gzip"})
        self.flush()

    def flush(self) -> None:
        """Make everything ingested so far searchable now."""
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=60) as response:
            response.read()


@dataclass
class VictoriaMetrics:
    """`with VictoriaMetrics(workdir) as vm:` a single-node server on loopback until exit.

    `scrape` is a Prometheus configuration (its `global` and `scrape_configs`; the JSON is YAML)
    the server scrapes as Prometheus would; `flags` are further server flags (they come after
    the defaults, so they override them)."""

    workdir: Path
    scrape: Json | None = None
    flags: Sequence[str] = ()
    retention: str = "100y"
    """How far back samples are kept: far enough for any backfilled history."""
    ready_timeout: float = 60.0
    api: VictoriaMetricsApi = field(init=False)
    process: subprocess.Popen[bytes] = field(init=False)
    _processes: Processes = field(init=False, default_factory=Processes)

    @property
    def url(self) -> str:
        return self.api.url

    def __enter__(self) -> VictoriaMetrics:
        try:
            self._start()
        except BaseException:
            self._processes.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._processes.close()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        command = [
            binary(SERVER),
            f"-storageDataPath={self.workdir / 'victoria-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-retentionPeriod={self.retention}",
            *SERVER_FLAGS,
        ]
        if self.scrape is not None:
            config = self.workdir / "victoria-scrape.yml"
            scrape = {
                key: self.scrape[key] for key in ("global", "scrape_configs") if key in self.scrape
            }
            config.write_text(json.dumps(scrape, indent=2), encoding="utf-8")
            command.append(f"-promscrape.config={config}")
        log = self.workdir / "victoria-metrics.log"
        self.process = self._processes.spawn([*command, *self.flags], log)
        self.api = VictoriaMetricsApi(f"http://127.0.0.1:{port}")
        wait_until(
            "victoria-metrics", lambda: answers(f"{self.url}/health"), self.ready_timeout, log
        )

    def copy_from(self, source: Prometheus, *, start: float, end: float) -> int:
        """Every raw sample `source` (a Prometheus) holds between `start` and `end` (unix
        seconds), copied over its HTTP API one metric name at a time; searchable on return; how
        many samples. Exact (values travel as Prometheus prints them, which parses back to the
        same float), for histories of a few million samples."""
        names = source.get("/api/v1/label/__name__/values")["data"]
        seconds = max(int(end - start) + 1, 1)
        copied = 0
        for name in names:
            answer = source.query(f'{{__name__="{name}"}}[{seconds}s]', at=end)
            series = [
                {
                    "metric": found["metric"],
                    "values": [float(value) for _, value in found["values"]],
                    "timestamps": [round(float(t) * 1000) for t, _ in found["values"]],
                }
                for found in answer["data"]["result"]
            ]
            copied += sum(len(one["values"]) for one in series)
            self.api.import_series(series)
        return copied

    def import_blocks(self, tsdb: Path, *, timeout: float = 3600.0, attempts: int = 3) -> int:
        """Every sample of a Prometheus TSDB directory's blocks (e.g. a promtool backfill) into
        this server, with `vmctl prometheus`; searchable on return; how many samples.

        Debian's vmctl (1.79) reading a snapshot's blocks concurrently (its default) leaves out
        some series' samples of a block without an error (at 35,000 series over two blocks, 4
        series lost the second block's 581 samples each, every time): it reads with one reader,
        and is run again until it says it imported every sample of the blocks; the server keeps
        one sample per series and millisecond (`-dedup.minScrapeInterval=1ms`), so samples sent
        twice count once. vmctl will only run with a terminal (its progress bars): it gets a
        pseudo-terminal, copied to `vmctl-N.log`."""
        counts = ("", "")
        for attempt in range(1, attempts + 1):
            log = self.workdir / f"vmctl-{attempt}.log"
            code = _vmctl(
                [
                    binary(VMCTL),
                    "prometheus",
                    "-s",
                    "--vm-disable-progress-bar",
                    f"--prom-snapshot={tsdb}",
                    f"--vm-addr={self.url}",
                    "--vm-concurrency=2",
                    "--prom-concurrency=1",
                ],
                log,
                timeout,
            )
            text = log.read_text(errors="replace")
            read = _VMCTL_READ.search(text)
            sent = _VMCTL_SENT.search(text)
            if code != 0 or read is None or sent is None:
                tail = "\n".join(text.splitlines()[-20:])
                raise StackError(f"vmctl could not import {tsdb} (exit {code}):\n{tail}")
            counts = (read[1], sent[1])
            if read[1] == sent[1]:
                self.api.flush()
                return int(read[1])
        raise StackError(
            f"vmctl imported {counts[1]} of the {counts[0]} samples of {tsdb} at its last of "
            f"{attempts} attempts"
        )


_VMCTL_READ: Final = re.compile(r"snapshot stats:.*?samples: (\d+);", re.DOTALL)
_VMCTL_SENT: Final = re.compile(r"total samples: (\d+);")


def _vmctl(command: Sequence[str], log: Path, timeout: float) -> int:
    """Run vmctl on a pseudo-terminal copied to `log`; its exit status."""
    main, terminal = pty.openpty()
    with log.open("wb") as output:

        def copy() -> None:
            with contextlib.suppress(OSError):  # EIO once vmctl has exited
                while chunk := os.read(main, 65536):
                    output.write(chunk)

        reader = threading.Thread(target=copy, name="vmctl-log", daemon=True)
        reader.start()
        try:
            done = subprocess.run(
                command,
                stdin=terminal,
                stdout=terminal,
                stderr=terminal,
                timeout=timeout,
                check=False,
            )
        finally:
            os.close(terminal)
            reader.join(timeout=10)
            os.close(main)
    return done.returncode


def _rule_flags(rule_files: Sequence[Path]) -> list[str]:
    return [f"-rule={path}" for path in rule_files]


@dataclass
class Vmalert:
    """`with Vmalert(workdir, datasource=vm.url) as alerts:` vmalert evaluating the rule files
    every `interval` against `datasource`, writing recording rules' results and alert states
    back to `remote_write` (by default the datasource itself) until exit. Alerts go nowhere
    (a notifier on loopback that nothing listens on)."""

    workdir: Path
    datasource: str
    rule_files: Sequence[Path] = RULE_FILES
    interval: str = "15s"
    remote_write: str | None = None
    flags: Sequence[str] = ()
    group_intervals: bool = False
    """Whether groups keep their own `interval` (as in production: benchmarks/fleet.py), else
    every group evaluates every `interval` (`at_one_interval`: a test stack)."""
    api: Prometheus = field(init=False)
    process: subprocess.Popen[bytes] = field(init=False)
    _processes: Processes = field(init=False, default_factory=Processes)

    def __enter__(self) -> Vmalert:
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            port = free_port()
            log = self.workdir / "vmalert.log"
            self.process = self._processes.spawn(
                [
                    binary(VMALERT),
                    *_rule_flags(
                        self.rule_files
                        if self.group_intervals
                        else at_one_interval(self.rule_files, self.workdir)
                    ),
                    f"-datasource.url={self.datasource}",
                    f"-remoteWrite.url={self.remote_write or self.datasource}",
                    f"-evaluationInterval={self.interval}",
                    f"-httpListenAddr=127.0.0.1:{port}",
                    f"-notifier.url=http://127.0.0.1:{free_port()}",
                    "-loggerLevel=WARN",
                    *self.flags,
                ],
                log,
            )
            self.api = Prometheus(f"http://127.0.0.1:{port}")
            wait_until("vmalert", lambda: answers(f"{self.api.url}/health"), 60, log)
        except BaseException:
            self._processes.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._processes.close()

    def groups(self) -> list[Json]:
        """vmalert's rule groups (its /api/v1/rules), each rule with its `lastError`, `health` and
        `lastSamples`."""
        groups: list[Json] = self.api.get("/api/v1/rules")["data"]["groups"]
        return groups


def rule_levels(rule_files: Sequence[Path]) -> list[list[Json]]:
    """The rule files' groups split by dependency: level 0 reads only scraped series, level n a
    recording rule of level n - 1 at most; each level's groups keep their names and intervals.
    Alerting rules come with the level of what they read."""
    groups = [
        group
        for path in rule_files
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    ]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    level: dict[str, int] = {}

    def depth(rule: Json) -> int:
        read = set(_NAME.findall(rule["expr"])) & recorded
        return 1 + max((level[name] for name in read), default=-1)

    pending = [rule for group in groups for rule in group["rules"] if "record" in rule]
    while pending:
        ready = [
            rule for rule in pending if set(_NAME.findall(rule["expr"])) & recorded <= level.keys()
        ]
        if not ready:
            raise StackError(
                f"recording rules read each other in a cycle: {[r['record'] for r in pending]}"
            )
        for rule in ready:
            level[rule["record"]] = depth(rule)
        pending = [rule for rule in pending if rule not in ready]
    levels: list[list[Json]] = []
    for group in groups:
        for rule in group["rules"]:
            n = level[rule["record"]] if "record" in rule else depth(rule)
            while len(levels) <= n:
                levels.append([])
            same = [g for g in levels[n] if g["name"] == group["name"]]
            if not same:
                same = [{**{k: v for k, v in group.items() if k != "rules"}, "rules": []}]
                levels[n].append(same[0])
            same[0]["rules"].append(rule)
    return levels


_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def replay(
    workdir: Path,
    *,
    datasource: str,
    start: float,
    end: float,
    rule_files: Sequence[Path] = RULE_FILES,
    interval: str = "15s",
    remote_write: str | None = None,
    timeout: float = 600.0,
) -> str:
    """Every rule of `rule_files` evaluated every `interval` from `start` to `end` (unix seconds)
    against `datasource` (vmalert's replay mode), results written to `remote_write` (by default
    the datasource). Rules reading other rules' results run after them (`rule_levels`: one
    replay per level, each written before the next starts), so no delay between rules is
    needed. The log; a StackError with it if any rule failed."""
    workdir.mkdir(parents=True, exist_ok=True)
    logs = []
    for n, groups in enumerate(rule_levels(rule_files)):
        rules = workdir / f"replay-level-{n}.rules.yaml"
        rules.write_text(json.dumps({"groups": groups}, indent=2), encoding="utf-8")
        done = subprocess.run(
            [
                binary(VMALERT),
                f"-rule={rules}",
                f"-datasource.url={datasource}",
                f"-remoteWrite.url={remote_write or datasource}",
                f"-evaluationInterval={interval}",
                # Range queries at the evaluation interval (vmalert's default step is 5 minutes).
                f"-datasource.queryStep={interval}",
                f"-replay.timeFrom={rfc3339(start)}",
                f"-replay.timeTo={rfc3339(end)}",
                "-replay.rulesDelay=0s",
                "-replay.ruleRetryAttempts=1",
                "-replay.disableProgressBar",
                f"-httpListenAddr=127.0.0.1:{free_port()}",
            ],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        log = (done.stdout + done.stderr).decode(errors="replace")
        logs.append(log)
        (workdir / f"vmalert-replay-{n}.log").write_text(log, encoding="utf-8")
        failed = [line for line in log.splitlines() if "\terror\t" in line or "\tfatal\t" in line]
        if done.returncode != 0 or failed:
            raise StackError(
                f"vmalert's replay of {rules.name} failed (exit {done.returncode}):\n"
                + "\n".join(failed or log.splitlines()[-20:])
            )
        # VictoriaMetrics makes what it was sent searchable within a second or two: at once
        # here. Prometheus (remote-write receiver) has no such call, and needs none.
        with contextlib.suppress(urllib.error.HTTPError):
            VictoriaMetricsApi(remote_write or datasource).flush()
    return "\n".join(logs)
