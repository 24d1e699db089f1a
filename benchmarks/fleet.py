"""Proof at 1,000 nodes: one Prometheus and one VictoriaMetrics scrape the simulated node as a
fleet, evaluate gpuscope's rules, and answer the fleet dashboards' queries; prints one JSON
document.

    .venv/bin/python benchmarks/fleet.py                  # 1,000 nodes: ~25 min, ~13 GiB free
    .venv/bin/python benchmarks/fleet.py --nodes 20 --warmup 400      # the same in ~8 min

The node is the one of `benchmarks/daemon.py --pods` and `benchmarks/series.py` (8 simulated
H100s, 64 processes each in a pod of its own, time-sliced 8 per GPU, 200 pods, the soak's pod
turnover), one daemon as it ships (`benchmarks/runtime.py`) in its default configuration. Both
stores scrape it as `--nodes` static targets: each target gets `node` and `instance` labels of
its own, and metric relabelling makes its GPUs, pods and workloads distinct (`uuid` and `pod`
get the node's name, `workload` that of a group of `--nodes-per-workload` nodes, `namespace` that
of a group of `--nodes-per-namespace`), so the rules' joins and rollups see a fleet: 8,000 GPUs,
64,000 allocations, 2,560 workloads in 10 namespaces at 1,000 nodes.

1. Debian's `prometheus` and `victoria-metrics` each scrape every target every
   `--scrape-interval` (30 s); Prometheus evaluates deploy/prometheus/gpuscope.rules.yaml every
   `--evaluation-interval` (1 m, Prometheus' default), and `vmalert` (dashboards/victoria.py) the
   same file against VictoriaMetrics at the same interval, for `--warmup` seconds (8 min): the
   5-minute windows fill and every rule has been evaluated several times.
2. A day of history for the rollups the dashboards read over a range: each rollup series as
   Prometheus recorded it last, swinging over the day (rates and ratios), one sample every
   `--history-step` seconds (60, the evaluation interval) up to the live data, written as
   OpenMetrics, made into blocks by `promtool tsdb create-blocks-from openmetrics`, moved into
   Prometheus' data directory (it loads new blocks within a minute) and imported into
   VictoriaMetrics with `vmctl` (the same samples in both). A 24 h dashboard range then reads a day of rollups, as it would in a
   cluster. The raw and per-allocation series have only the live minutes: the dashboards read
   them over a range nowhere (tests/test_dashboards.py keeps it so), and a day of them would be
   billions of samples to write.
3. Each store's head (active) series, resident memory (VmRSS, and the peak VmHWM), and the
   time each rule group took per evaluation over the warm-up (Prometheus' /api/v1/rules sampled
   every evaluation, with the costliest rules; vmalert's vmalert_iteration_duration_seconds).
4. Every panel, annotation and variable query of the cluster overview and workloads dashboards,
   the variables at "All", over a 1 h and a 24 h range with the step Grafana would take for a
   1,000-pixel-wide panel (at least the scrape interval), `--repeats` times on each store: the
   median latency of each and the worst. Target: every query under 1 s at 1,000 nodes.
5. Whether the stores agree, query by query: the series each answers now (an instant query, a
   range query's last step, a variable's values) and their values, within `--tolerance`
   (relative); and a range query's steps over the history, the same samples in both, equal.
   The live minutes are each store's own scrapes and rule evaluations, seconds apart, and
   MetricsQL's rate() does not extrapolate to the window's edges as PromQL's does; alert states
   are each rule engine's own `for:` clocks.

The rules' own windows ([1h], [1d]) hold only the warm-up's samples: rule times are those of a
fleet a few minutes old, and the daily rules (p95 over a day, the day's peak) read up to a day of
recorded series once the fleet is a day old.

One file over 700 lines on purpose: a benchmark run by hand, whose five steps above share one
fleet's state and read top to bottom in that order; nothing else imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-ins live in tests/

from benchmarks.daemon import attributed_node, fleet  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402
from dashboards import promql  # noqa: E402
from dashboards.live import RULE_FILES, Processes, Prometheus, answers, free_port, wait_until  # noqa: E402
from dashboards.queries import EVALUATIONS  # noqa: E402
from dashboards.victoria import VictoriaMetrics, Vmalert  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

Json = dict[str, Any]

DASHBOARDS: Final = ("cluster-overview.json", "workloads.json")
RANGES: Final = {"1h": 3600, "24h": 86400}
PANEL_PIXELS: Final = 1000
"""Grafana's maxDataPoints for a panel this wide: the step is range / pixels, rounded."""
SWINGING: Final = ("rate5m", "ratio")
"""Rollups whose history swings over the day (±20 %); the counts and sums stay as recorded."""
LATENCY_TARGET_SECONDS: Final = 1.0
PAGE: Final = os.sysconf("SC_PAGE_SIZE")
TICKS: Final = os.sysconf("SC_CLK_TCK")


def grafana_step(range_seconds: float, scrape_seconds: float, points: int | None = None) -> float:
    """The $__interval Grafana gives a panel: range / its maxDataPoints (else its width in
    pixels) rounded as Grafana rounds it, never under the data source's scrape interval."""
    raw = range_seconds / (points or PANEL_PIXELS)
    table = [
        (1.5, 1),
        (3.5, 2),
        (7.5, 5),
        (12.5, 10),
        (17.5, 15),
        (25, 20),
        (45, 30),
        (90, 60),
        (210, 120),
        (450, 300),
        (750, 600),
        (1050, 900),
        (1500, 1200),
        (2700, 1800),
        (5400, 3600),
    ]
    rounded = next((step for bound, step in table if raw <= bound), 7200)
    return max(float(rounded), scrape_seconds)


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


def scrape_config(args: argparse.Namespace, port: int) -> Json:
    """prometheus.yml (JSON is YAML) for both stores: the daemon as `--nodes` targets."""
    relabel = [
        # a node's own GPUs and pods; workloads and namespaces span groups of nodes
        {
            "source_labels": [label, source],
            "regex": "(.+);(.+)",
            "target_label": label,
            "replacement": "$1-$2",
        }
        for label, source in (
            ("uuid", "node"),
            ("parent_uuid", "node"),
            ("pod", "node"),
            ("workload", "workload_group"),
            ("namespace", "namespace_group"),
        )
    ]
    relabel.append({"regex": "workload_group|namespace_group", "action": "labeldrop"})
    targets = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {
                "node": f"node-{n:04d}",
                "workload_group": f"w{n // args.nodes_per_workload:03d}",
                "namespace_group": f"n{n // args.nodes_per_namespace:02d}",
            },
        }
        for n in range(args.nodes)
    ]
    return {
        "global": {
            "scrape_interval": args.scrape_interval,
            "scrape_timeout": args.scrape_interval,
            "evaluation_interval": args.evaluation_interval,
        },
        "rule_files": [str(path) for path in RULE_FILES],
        "scrape_configs": [
            {
                "job_name": "gpuscope",
                "static_configs": targets,
                "relabel_configs": [
                    {
                        "source_labels": ["node"],
                        "target_label": "instance",
                        "replacement": "$1:9455",
                    },
                ],
                "metric_relabel_configs": relabel,
            }
        ],
    }


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def metrics(url: str) -> dict[str, float]:
    """A /metrics page as {series text: value}."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                found[series] = float(value)
    return found


def appended(found: dict[str, float]) -> float:
    """Samples Prometheus has appended to its head since it started."""
    return sum(
        value
        for series, value in found.items()
        if series.startswith("prometheus_tsdb_head_samples_appended_total")
    )


def mib(value: float) -> float:
    return round(value / 2**20, 1)


@contextlib.contextmanager
def prometheus(workdir: Path, config: Json) -> Iterator[tuple[Prometheus, int, Path]]:
    """Debian's prometheus on loopback with `config`; yields its client, pid and data dir."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "prometheus.yml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    data = workdir / "data"
    port = free_port()
    processes = Processes()
    log = workdir / "prometheus.log"
    try:
        process = processes.spawn(
            [
                shutil.which("prometheus") or "/usr/bin/prometheus",
                f"--config.file={path}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            log,
        )
        client = Prometheus(f"http://127.0.0.1:{port}")
        wait_until("prometheus", lambda: answers(f"{client.url}/-/ready"), 120, log)
        yield client, process.pid, data
    finally:
        processes.close()


class RuleTimes:
    """Each group's evaluation times over the warm-up, from both rule engines."""

    def __init__(self, prometheus: Prometheus, vmalert: Prometheus | None) -> None:
        self.prometheus = prometheus
        self.vmalert = vmalert
        self.seen: dict[str, dict[str, float]] = {}  # group -> lastEvaluation -> seconds
        self.rules: dict[str, dict[str, float]] = {}  # rule -> lastEvaluation -> seconds

    def sample(self) -> None:
        answer = self.prometheus.get("/api/v1/rules")
        for group in answer.get("data", {}).get("groups", []):
            evaluations = self.seen.setdefault(group["name"], {})
            if group.get("lastEvaluation", "").startswith("0001"):
                continue  # not evaluated yet
            evaluations[group["lastEvaluation"]] = float(group["evaluationTime"])
            for rule in group.get("rules", []):
                if not rule.get("lastEvaluation", "").startswith("0001"):
                    name = f"{group['name']}: {rule['name']}"
                    times = self.rules.setdefault(name, {})
                    times[rule["lastEvaluation"]] = float(rule["evaluationTime"])

    def costliest_rules(self, count: int = 12) -> Json:
        """The rules Prometheus spent longest on, median seconds per evaluation: where a group's
        time goes."""
        medians = {name: statistics.median(t.values()) for name, t in self.rules.items() if t}
        ranked = sorted(medians.items(), key=lambda item: item[1], reverse=True)[:count]
        return {name: round(seconds, 4) for name, seconds in ranked}

    def prometheus_report(self) -> Json:
        return {
            name: {
                "evaluations": len(times),
                "median_seconds": round(statistics.median(times.values()), 4),
                "max_seconds": round(max(times.values()), 4),
            }
            for name, times in self.seen.items()
            if times
        }

    def vmalert_report(self) -> Json:
        if self.vmalert is None:
            return {}
        found = metrics(self.vmalert.url)
        report: Json = {}
        for series, value in found.items():
            if not series.startswith("vmalert_iteration_duration_seconds"):
                continue
            group = series.split('group="', 1)[1].split('"', 1)[0]
            entry = report.setdefault(group, {})
            if series.startswith("vmalert_iteration_duration_seconds_sum"):
                entry["sum"] = value
            elif series.startswith("vmalert_iteration_duration_seconds_count"):
                entry["evaluations"] = int(value)
            elif 'quantile="0.99"' in series and not math.isnan(value):
                entry["p99_seconds"] = round(value, 4)
            elif 'quantile="0.5"' in series and not math.isnan(value):
                entry["median_seconds"] = round(value, 4)
        for entry in report.values():
            total = entry.pop("sum", 0.0)
            if entry.get("evaluations"):
                entry["mean_seconds"] = round(total / entry["evaluations"], 4)
        return report


def read_over_ranges() -> list[str]:
    """The recorded series the fleet dashboards read over a range: those a day of history is
    written for (tests/test_dashboards.py keeps them rollups)."""
    names: set[str] = set()
    for file in DASHBOARDS:
        dashboard = json.loads((ROOT / "dashboards" / file).read_text(encoding="utf-8"))
        values = promql.grafana_values(
            dashboard, interval=60, scrape_seconds=30, range_seconds=3600
        )
        exprs = [
            query.expr
            for query in promql.queries(dashboard)
            if not query.instant or "$__range" in query.expr
        ]
        exprs += [
            promql.label_values(variable["query"])[0]
            for variable in promql.variables(dashboard)[1:]
        ]
        for expr in exprs:
            names |= promql.metric_names(promql.substitute(expr, values))
    return sorted(name for name in names if ":" in name)


def history(
    store: Prometheus, workdir: Path, *, start: float, end: float, step: float
) -> tuple[Path, Json]:
    """A day of the rollups the dashboards read over a range, as OpenMetrics made into TSDB
    blocks by promtool; the blocks' dir and what was written."""
    began = time.monotonic()
    selector = '{__name__=~"' + "|".join(read_over_ranges()) + '"}'
    now = store.query(selector)["data"]["result"]
    by_name: dict[str, list[Json]] = {}
    for series in now:
        by_name.setdefault(series["metric"]["__name__"], []).append(series)
    text = workdir / "history.om"
    stamps = [start + k * step for k in range(int((end - start) // step) + 1)]
    day = 2 * math.pi / 86400
    samples = 0
    with text.open("w", encoding="utf-8") as out:
        for name, series_list in sorted(by_name.items()):
            out.write(f"# TYPE {name} gauge\n")
            swings = any(part in name for part in SWINGING)
            for number, series in enumerate(series_list):
                labels = ",".join(
                    f'{key}="{value}"'
                    for key, value in sorted(series["metric"].items())
                    if key != "__name__"
                )
                head = f"{name}{{{labels}}} "
                value = float(series["value"][1])
                if name == EVALUATIONS:  # the evaluations' own times
                    lines = [f"{head}{t:.0f} {t:.0f}\n" for t in stamps]
                elif swings:
                    phase = number * 0.7
                    lines = [
                        f"{head}{value * (1 + 0.2 * math.sin(t * day + phase)):.6g} {t:.0f}\n"
                        for t in stamps
                    ]
                else:
                    constant = f"{value:.6g}"
                    lines = [f"{head}{constant} {t:.0f}\n" for t in stamps]
                out.writelines(lines)
                samples += len(lines)
        out.write("# EOF\n")
    written = time.monotonic() - began
    blocks = workdir / "history-blocks"
    promtool_blocks(text, blocks)
    size = text.stat().st_size
    text.unlink()
    return blocks, {
        "series": len(now),
        "samples": samples,
        "step_seconds": step,
        "openmetrics_bytes": size,
        "write_seconds": round(written, 1),
        "promtool_seconds": round(time.monotonic() - began - written, 1),
    }


def promtool_blocks(text: Path, blocks: Path) -> None:
    """TSDB blocks in `blocks` from an OpenMetrics file, by `promtool tsdb create-blocks-from`."""
    subprocess.run(
        [
            shutil.which("promtool") or "/usr/bin/promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--quiet",
            # one pass over the file for the day, not one per 2-hour block
            "--max-block-duration=24h",
            str(text),
            str(blocks),
        ],
        check=True,
        capture_output=True,
        timeout=7200,
    )


def load_history(prometheus_data: Path, store: Prometheus, blocks: Path, at: float) -> float:
    """Move the blocks into Prometheus' data dir; seconds until it answers from them."""
    began = time.monotonic()
    for block in blocks.iterdir():
        if block.is_dir():
            shutil.copytree(block, prometheus_data / block.name)
    wait_until(
        "prometheus to load the history's blocks",
        lambda: bool(
            store.query("count(count_over_time(node_model:gpu_info:count[1h]))", at=at)["data"][
                "result"
            ]
        ),
        300,
    )
    return round(time.monotonic() - began, 1)


def dashboard_queries(scrape_seconds: float) -> list[tuple[str, str, str, str, float]]:
    """(range, name, kind, expr or selector, step) for every query of the fleet dashboards."""
    found = []
    for file in DASHBOARDS:
        dashboard = json.loads((ROOT / "dashboards" / file).read_text(encoding="utf-8"))
        for label, span in RANGES.items():
            step = grafana_step(span, scrape_seconds)
            values = promql.grafana_values(
                dashboard, interval=step, scrape_seconds=scrape_seconds, range_seconds=span
            )
            for query in promql.queries(dashboard):
                kind = "instant" if query.instant else "range"
                own = grafana_step(span, scrape_seconds, query.max_points)
                own_values = promql.grafana_values(
                    dashboard, interval=own, scrape_seconds=scrape_seconds, range_seconds=span
                )
                found.append(
                    (label, query.name, kind, promql.substitute(query.expr, own_values), own)
                )
            for variable in promql.variables(dashboard)[1:]:
                selector, _ = promql.label_values(variable["query"])
                found.append(
                    (
                        label,
                        f"{dashboard['title']} / ${variable['name']}",
                        "variable",
                        promql.substitute(selector, values),
                        step,
                    )
                )
    return found


def run(store: Prometheus, kind: str, expr: str, span: float, step: float, at: float) -> Json:
    """One query as Grafana would send it; an answer that takes longer than the client's 30 s
    is an error answer saying so."""
    end = math.floor(at / step) * step
    try:
        if kind == "instant":
            return store.query(expr, at=at)
        if kind == "range":
            return store.query_range(expr, start=end - span, end=end, step=step)
        return store.series(expr, start=at - span, end=at)
    except (TimeoutError, urllib.error.URLError) as error:
        return {"status": "error", "error": f"no answer: {error}"}


def latencies(
    store: Prometheus, queries: Sequence[tuple[str, str, str, str, float]], at: float, repeats: int
) -> tuple[list[Json], list[Json]]:
    """Each query's median latency and answer size, and the answers (for the comparison)."""
    results, answers_ = [], []
    for label, name, kind, expr, step in queries:
        span = RANGES[label]
        times = []
        answer: Json = {}
        for _ in range(repeats):
            began = time.perf_counter()
            answer = run(store, kind, expr, span, step, at)
            times.append(time.perf_counter() - began)
            if answer.get("status") != "success":
                break  # a failed or timed-out query is not asked again
        data = answer.get("data")
        size = len(data.get("result", [])) if isinstance(data, dict) else len(data or [])
        results.append(
            {
                "range": label,
                "query": name,
                "kind": kind,
                "median_seconds": round(statistics.median(times), 4),
                "series": size,
                **({"error": answer.get("error")} if answer.get("status") != "success" else {}),
            }
        )
        answers_.append(answer)
    return results, answers_


def summary(results: Sequence[Json]) -> Json:
    report: Json = {}
    for label in RANGES:
        mine = [r for r in results if r["range"] == label]
        worst = max(mine, key=lambda r: r["median_seconds"])
        report[label] = {
            "queries": len(mine),
            "failed": [r["query"] for r in mine if "error" in r],
            "empty": [r["query"] for r in mine if r["series"] == 0 and "error" not in r],
            "worst": worst,
            "median_of_medians_seconds": round(
                statistics.median(r["median_seconds"] for r in mine), 4
            ),
            "over_target": [
                r["query"] for r in mine if r["median_seconds"] >= LATENCY_TARGET_SECONDS
            ],
        }
    return report


def keyed(answer: Json, kind: str) -> dict[str, list[tuple[float, float]]]:
    """An answer as {label set without the name: [(time, value), ...]}."""
    data = answer.get("data")
    if kind == "variable":
        return {
            json.dumps({k: v for k, v in s.items() if k != "__name__"}, sort_keys=True): []
            for s in data or []
        }
    found = {}
    for series in (data or {}).get("result", []):
        key = json.dumps(
            {k: v for k, v in series["metric"].items() if k != "__name__"}, sort_keys=True
        )
        points = series.get("values") or [series["value"]]
        found[key] = [(float(t), float(v)) for t, v in points]
    return found


def latest(answer: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """The series of an answer present at its last step (every series of an instant answer or a
    variable's values), with their values there."""
    last = max((t for points in answer.values() for t, _ in points), default=0.0)
    return {
        key: points[-1][1] if points else 0.0
        for key, points in answer.items()
        if not points or points[-1][0] == last
    }


def relative(v: float, w: float) -> float:
    """|v - w| over the larger of the two; 0 when both are 0 or either is NaN."""
    if math.isnan(v) or math.isnan(w) or max(abs(v), abs(w)) == 0:
        return 0.0
    return abs(v - w) / max(abs(v), abs(w))


def agreement(
    queries: Sequence[tuple[str, str, str, str, float]],
    ours: Sequence[Json],
    theirs: Sequence[Json],
    *,
    live_from: float,
    tolerance: float,
) -> Json:
    """Per query: the series each store answers at its own last instant (an instant query, a
    range query's last step, a variable's values) and the largest relative difference between
    their values there, and between their values at the steps both answer over the history
    (before the live data)."""
    differ: list[Json] = []
    checked: list[Json] = []
    for (label, name, kind, _, _), a, b in zip(queries, ours, theirs, strict=True):
        left, right = keyed(a, kind), keyed(b, kind)
        now_left, now_right = latest(left), latest(right)
        if now_left.keys() != now_right.keys():
            differ.append(
                {
                    "range": label,
                    "query": name,
                    "only_prometheus": sorted(now_left.keys() - now_right.keys())[:3],
                    "only_victoriametrics": sorted(now_right.keys() - now_left.keys())[:3],
                    "series": len(now_left.keys() | now_right.keys()),
                }
            )
        now = max(
            (relative(now_left[key], now_right[key]) for key in now_left.keys() & now_right.keys()),
            default=0.0,
        )
        past = 0.0
        for key in left.keys() & right.keys():
            other = dict(right[key])
            for t, v in left[key]:
                if t < live_from and t in other:
                    past = max(past, relative(v, other[t]))
        checked.append(
            {"range": label, "query": name, "now": round(now, 4), "history": round(past, 4)}
        )
    return {
        "queries": len(queries),
        "same_series_now": len(queries) - len(differ),
        "values_within_tolerance_now": sum(c["now"] <= tolerance for c in checked),
        "values_equal_over_history": sum(c["history"] == 0 for c in checked),
        "tolerance": tolerance,
        "different_series_now": differ,
        "beyond_tolerance_now": sorted(
            (c for c in checked if c["now"] > tolerance), key=lambda c: -c["now"]
        ),
        "different_over_history": [c for c in checked if c["history"] > 0],
    }


def warm_up(args: argparse.Namespace, pids: dict[str, int], sample: Any) -> Json:
    """`--warmup` seconds of the live fleet, `sample()` after each evaluation; the CPU each
    process used (cores) and the machine's load meanwhile."""
    began = time.time()
    cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
    loads = []
    while time.time() - began < args.warmup:
        time.sleep(seconds(args.evaluation_interval))
        sample()
        loads.append(os.getloadavg()[0])
    spent = time.time() - began
    return {
        "cpu_cores_used": {
            name: round((cpu_seconds(pid) - cpu[name]) / spent, 2) for name, pid in pids.items()
        },
        "machine_load_1m": {"min": min(loads, default=0.0), "max": max(loads, default=0.0)},
    }


def measure_queries(
    report: Json, store: Prometheus, pid: int, repeats: int, scrape_seconds: float
) -> tuple[list[Json], list[Json], float]:
    at = time.time()
    queries = dashboard_queries(scrape_seconds)
    results, answers_ = latencies(store, queries, at, repeats)
    report["queries"] = summary(results)
    report["rss_mib_after_queries"] = mib(rss(pid)[0])
    return results, answers_, at


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--nodes-per-workload", type=int, default=25)
    parser.add_argument("--nodes-per-namespace", type=int, default=100)
    parser.add_argument("--scrape-interval", default="30s")
    parser.add_argument("--evaluation-interval", default="1m")
    parser.add_argument("--warmup", type=float, default=420.0, help="seconds of live fleet")
    parser.add_argument("--history-step", type=float, default=60.0, help="0: no history")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--no-victoriametrics", action="store_true")
    parser.add_argument("--pod-changes", type=float, default=1.0, help="pod changes per second")
    args = parser.parse_args()
    scrape_seconds = seconds(args.scrape_interval)
    report: Json = {
        "benchmark": "fleet",
        "nodes": args.nodes,
        "node": {
            "gpus": 8,
            "processes": 64,
            "pods": 200,
            "pod_changes_per_second": args.pod_changes,
        },
        "scrape_interval": args.scrape_interval,
        "evaluation_interval": args.evaluation_interval,
        "warmup_seconds": args.warmup,
        "machine": {"cores": os.cpu_count(), "load_at_start": os.getloadavg()},
    }
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as node:
            work = Path(scratch)
            fleet_file = work / "fleet.yaml"
            fleet_file.write_text(yaml.safe_dump(fleet(8, 64)))
            attribution = node.enter_context(
                attributed_node(work, fleet_file, 64, 200, args.pod_changes)
            )
            daemon, port = node.enter_context(
                serving([f"--simulate={fleet_file}", *attribution], work / "daemon.log")
            )
            config = scrape_config(args, port)
            queries = dashboard_queries(scrape_seconds)

            # Prometheus alone, then VictoriaMetrics alone: the machine holds one fleet at a time.
            blocks = None
            with prometheus(work / "prometheus", config) as (prom, prom_pid, prom_data):
                live_from = time.time()
                times = RuleTimes(prom, None)
                phase = warm_up(args, {"prometheus": prom_pid, "daemon": daemon.pid}, times.sample)
                found = metrics(prom.url)
                rss_now, rss_peak = rss(prom_pid)
                prom_report: Json = {
                    "head_series": int(found.get("prometheus_tsdb_head_series", 0)),
                    "samples_appended_per_second": round(
                        appended(found) / (time.time() - live_from)
                    ),
                    "rss_mib": mib(rss_now),
                    "rss_mib_peak": mib(rss_peak),
                    **phase,
                    "rule_groups": times.prometheus_report(),
                    "costliest_rules": times.costliest_rules(),
                }
                report["prometheus"] = prom_report
                if args.history_step > 0:
                    blocks, written = history(
                        prom,
                        work,
                        start=live_from - 86400,
                        end=live_from - args.history_step,
                        step=args.history_step,
                    )
                    written["prometheus_load_seconds"] = load_history(
                        prom_data, prom, blocks, live_from - 43200
                    )
                    report["history"] = written
                prom_results, prom_answers, _ = measure_queries(
                    prom_report, prom, prom_pid, args.repeats, scrape_seconds
                )
            every: Json = {"prometheus": prom_results}

            if not args.no_victoriametrics:
                # VictoriaMetrics' scrape config has no evaluation interval (vmalert's flag is)
                scrape = {**config, "global": {**config["global"]}}
                del scrape["global"]["evaluation_interval"]
                with (
                    VictoriaMetrics(work / "victoria", scrape=scrape) as vm,
                    Vmalert(
                        work / "vmalert",
                        datasource=vm.url,
                        interval=args.evaluation_interval,
                        group_intervals=True,
                    ) as vmalert,
                ):
                    pids = {
                        "victoriametrics": vm.process.pid,
                        "vmalert": vmalert.process.pid,
                        "daemon": daemon.pid,
                    }
                    phase = warm_up(args, pids, lambda: None)
                    found = metrics(vm.url)
                    vm_rss, vm_peak = rss(vm.process.pid)
                    vm_report: Json = {
                        # the series seen this hour: empty for a while after the hour turns,
                        # so the series created since the (fresh) store started are counted too
                        "active_series": int(
                            found.get('vm_cache_entries{type="storage/hour_metric_ids"}', 0)
                        ),
                        "series_created": int(found.get("vm_new_timeseries_created_total", 0)),
                        "rss_mib": mib(vm_rss),
                        "rss_mib_peak": mib(vm_peak),
                        "vmalert_rss_mib": mib(rss(vmalert.process.pid)[0]),
                        **phase,
                        "rule_groups": RuleTimes(vm.api, vmalert.api).vmalert_report(),
                    }
                    report["victoriametrics"] = vm_report
                    if blocks is not None:
                        loaded = time.monotonic()
                        vm.import_blocks(blocks)
                        report["history"]["victoriametrics_import_seconds"] = round(
                            time.monotonic() - loaded, 1
                        )
                    vm_results, vm_answers, _ = measure_queries(
                        vm_report, vm.api, vm.process.pid, args.repeats, scrape_seconds
                    )
                every["victoriametrics"] = vm_results
                report["agreement"] = agreement(
                    queries, prom_answers, vm_answers, live_from=live_from, tolerance=args.tolerance
                )
            report["every_query"] = every
            report["machine"]["load_at_end"] = os.getloadavg()
    except Exception as error:  # what was measured before is still printed
        report["error"] = f"{type(error).__name__}: {error}"
    report["wall_seconds"] = round(time.monotonic() - began)
    worst = [
        report[store]["queries"][label]["worst"]["median_seconds"]
        for store in ("prometheus", "victoriametrics")
        if "queries" in report.get(store, {})
        for label in RANGES
    ]
    report["target_every_query_under_1s"] = bool(worst) and max(worst) < LATENCY_TARGET_SECONDS
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
