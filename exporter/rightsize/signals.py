"""One PromQL template per signal of the usage history, aggregated inside Prometheus.

Every signal is one instant query at the end of the window; statistics over time come from
`*_over_time` functions over the raw samples or over subqueries (`[14d:5m]`), so Prometheus
returns one number per GPU a pod held instead of 4,000 points. Utilization comes from the
integrated counters: `rate(gpu_pod_busy_seconds_total[STEP])` evaluated every STEP is the exact
average of each slice, whatever the scrape interval (at most half of STEP), and `increase` over
the window is the exact busy time.

Aggregations (`sum by`, `max by`, joins) sit outside the `*_over_time` functions: inside a
subquery Prometheus would evaluate them at every one of its 4,000 steps, which costs ten times
more than the rest of the query. Joins that would need them per step (device activity onto the
pod holding the device) happen in `history.assemble`, in Python, by uuid. One device's series can
be split in time (the daemon restarted and the scrape's `instance` label changed), so counts and
increases add up across series (`sum by`) while percentiles and peaks take the largest (`max by`).

Each signal says what its values measure, so a value no such measure can take drops its series
(`Signal.bounds`); the per-pod signals name the pods they ask about, in batches of bounded size
(`pod_batches`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.history import Grouping
from exporter.rightsize.prometheus import ANY_FINITE, Bounds
from exporter.rightsize.selection import promql_string

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.rightsize.selection import Selection

IDLE_QUANTILE: Final = 0.99
"""A GPU is idle when even this quantile of its utilization stays under the idle threshold."""
MEMORY_QUANTILE: Final = 0.99
SHARING_STEP: Final = 3600.0
"""Resolution at which the pods time-slicing a GPU are counted (a per-step count is costly)."""
RATIO_LIMIT: Final = 2.0
"""The largest believable ratio (utilization, SM activity): a rate over a short range runs a
little past 1 when scrapes come late; twice full is no measurement."""
SUM_SLACK: Final = 4.0
"""How far a count of steps or a sum of seconds may run past the window: a device's series split
in time add up, and may overlap while a daemon restarts."""
MAX_GPU_MEMORY_BYTES: Final = float(1 << 40)
"""No GPU holds a TiB (the catalog's largest: 180 GiB)."""
MAX_CORES: Final = 100_000.0
MAX_HOLDERS: Final = 10_000.0
MAX_REPLICAS: Final = 1_000_000.0
MAX_TOKENS_PER_SECOND: Final = 1e9
MAX_FLOPS: Final = 1e18
"""FLOP/s of one GPU: an exaflop is a thousand of today's best."""
MAX_BANDWIDTH: Final = 1e15
"""Bytes per second of one GPU's memory: a PB/s is a hundred times today's best."""


def _bounds(measure: str, window: float, step: float) -> Bounds:
    """What a signal measuring `measure` can be over this window and step."""
    steps = SUM_SLACK * (window / step + 1)
    return {
        "ratio": Bounds(0.0, RATIO_LIMIT, "a ratio"),
        "steps": Bounds(0.0, steps, "a count of steps"),
        "seconds": Bounds(0.0, SUM_SLACK * window, "seconds within the window"),
        "bytes": Bounds(0.0, MAX_GPU_MEMORY_BYTES, "bytes of GPU memory"),
        "timestamp": Bounds(0.0, 1e11, "unix seconds"),
        "holders": Bounds(0.0, MAX_HOLDERS, "pods sharing a GPU"),
        "cores": Bounds(0.0, MAX_CORES, "CPU cores"),
        "tokens": Bounds(0.0, MAX_TOKENS_PER_SECOND * steps, "tokens per second, summed"),
        "flops": Bounds(1.0, MAX_FLOPS, "FLOP/s"),
        "bandwidth": Bounds(1.0, MAX_BANDWIDTH, "bytes per second"),
        "replicas": Bounds(0.0, MAX_REPLICAS, "replicas"),
    }.get(measure, ANY_FINITE)


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    template: str
    """PromQL with `{D}` (the device labels), `{U}` (a GPU's), `{C}` (a container's), `{H}` (an
    autoscaler's), `{K}` (the cluster label and a comma, or nothing), `{m}` (namespace matchers),
    `{w}` (window), `{s}` (step), `{c}` (the sharing step), `{q}` (the strategy's quantile), `{f}`
    (the label-selector filter), `{pods}` (matchers for the pods found)."""
    required: bool = False
    """A failed required signal fails the report; a failed optional one only blanks its field."""
    per_pod: bool = False
    """Asked only once the pods holding GPUs are known (cAdvisor and kube-state-metrics have
    series for every container of the cluster: the query names the pods it wants)."""
    per_term: bool = True
    """Asked again over each shorter term: the strategy needs it to recommend."""
    measures: str = "any"
    """What its values are (`ratio`, `bytes`, ... : `_bounds`): a value no such measure can
    take (negative, a ratio of 1e308) drops its series with a warning."""

    def bounds(self, window: float, step: float) -> Bounds:
        return _bounds(self.measures, window, step)


_HELD_UUIDS: Final = (
    # Device series carry no namespace: keep the GPUs the selected pods held.
    " and on ({U}) group by ({U}) (last_over_time(gpu_allocation_info{{{m}}}[{w}]))"
)


SIGNALS: Final = (
    Signal(
        "held",
        "sum by ({D}, container, model, mig_profile, resource) "
        "(count_over_time(gpu_allocation_info{{{m}}}[{w}:{s}])){f}",
        required=True,
        measures="steps",
    ),
    Signal(
        "present",
        "max by ({D}) (timestamp(gpu_allocation_info{{{m}}})){f}",
        required=True,
        per_term=False,
        measures="timestamp",
    ),
    Signal(
        "shared",
        "max by ({D}) (max_over_time(gpu_allocation_shared{{{m}}}[{w}])){f}",
        measures="ratio",
    ),
    Signal(
        "sharers",
        # Every holder counts, whatever the selection: the cost of a shared GPU is split by all.
        "avg_over_time((count by ({U}) (gpu_allocation_shared == 1))[{w}:{c}])",
        measures="holders",
    ),
    Signal(
        # What the holder reserved of the GPU (HAMi, KAI, DRA capacity sharing), averaged while
        # held; absent from a daemon older than the series (1/holders stands in).
        "share",
        "max by ({D}) (avg_over_time(gpu_allocation_share_ratio{{{m}}}[{w}])){f}",
        measures="ratio",
    ),
    Signal(
        "in_use",
        "max by ({D}) (avg_over_time(gpu_allocation_in_use{{{m}}}[{w}])){f}",
        measures="ratio",
    ),
    Signal(
        "busy_steps",
        "sum by ({D}) (count_over_time(rate(gpu_pod_busy_seconds_total{{{m}}}[{s}])[{w}:{s}])){f}",
        required=True,
        measures="steps",
    ),
    Signal(
        "busy_seconds",
        "sum by ({D}) (increase(gpu_pod_busy_seconds_total{{{m}}}[{w}])){f}",
        required=True,
        measures="seconds",
    ),
    Signal(
        "busy_quantile",
        "max by ({D}) "
        "(quantile_over_time({q}, rate(gpu_pod_busy_seconds_total{{{m}}}[{s}])[{w}:{s}])){f}",
        required=True,
        measures="ratio",
    ),
    Signal(
        "busy_idle_quantile",
        f"max by ({{D}}) (quantile_over_time({IDLE_QUANTILE}, "
        "rate(gpu_pod_busy_seconds_total{{{m}}}[{s}])[{w}:{s}])){f}",
        required=True,
        measures="ratio",
    ),
    Signal(
        "memory_peak",
        "max by ({D}) (max_over_time(gpu_pod_memory_used_bytes{{{m}}}[{w}])){f}",
        required=True,
        measures="bytes",
    ),
    Signal(
        "memory_quantile",
        f"max by ({{D}}) (quantile_over_time({MEMORY_QUANTILE}, "
        "gpu_pod_memory_used_bytes{{{m}}}[{w}])){f}",
        measures="bytes",
    ),
    Signal(
        "sm_quantile",
        "max by ({U}) (quantile_over_time({q}, rate(gpu_sm_active_seconds_total[{s}])[{w}:{s}]))"
        + _HELD_UUIDS,
        measures="ratio",
    ),
    Signal(
        "sm_seconds",
        "sum by ({U}) (increase(gpu_sm_active_seconds_total[{w}]))" + _HELD_UUIDS,
        measures="seconds",
    ),
    Signal(
        "tensor_seconds",
        "sum by ({U}) (increase(gpu_tensor_active_seconds_total[{w}]))" + _HELD_UUIDS,
        measures="seconds",
    ),
    Signal(
        "dram_seconds",
        "sum by ({U}) (increase(gpu_dram_active_seconds_total[{w}]))" + _HELD_UUIDS,
        measures="seconds",
    ),
    Signal(
        "cpu_usage_quantile",
        "max by ({C}) (quantile_over_time({q}, "
        'rate(container_cpu_usage_seconds_total{{container!="", container!="POD", {pods}}}[{s}])'
        "[{w}:{s}]))",
        per_pod=True,
        measures="cores",
    ),
    Signal(
        "cpu_limit",
        "max by ({C}) (max_over_time("
        'kube_pod_container_resource_limits{{resource="cpu", {pods}}}[{w}]))',
        per_pod=True,
        measures="cores",
    ),
    Signal(
        # Tokens (prompt + output) its inference servers served over the window, from the
        # serving rules' per-workload rate: each step's rate times the step, summed.
        "served_tokens",
        "sum by ({K}namespace, workload_kind, workload) "
        "(sum_over_time(workload_model:serving_tokens:rate5m{{{m}}}[{w}:{s}]))",
        per_term=False,
        measures="tokens",
    ),
    Signal(
        # The queue each workload's pods were admitted through (showback per queue): the daemon's
        # gpu_pod_queue_info joined to the pods' workloads by gpu_pod_info; every value is 1.
        "queue",
        "max by ({K}namespace, workload_kind, workload, queue, queue_kind) ("
        "last_over_time(gpu_pod_queue_info{{{m}}}[{w}])"
        " * on ({K}namespace, pod) group_left (workload_kind, workload) "
        "max by ({K}namespace, pod, workload_kind, workload) "
        "(last_over_time(gpu_pod_info{{{m}}}[{w}])))",
        per_term=False,
        measures="ratio",
    ),
    Signal(
        "calibrated_flops",
        "avg by (model, dtype) (last_over_time(gpu_calibrated_flops[{w}]))",
        per_term=False,
        measures="flops",
    ),
    Signal(
        "calibrated_bandwidth",
        "avg by (model) (last_over_time(gpu_calibrated_memory_bandwidth_bytes_per_second[{w}]))",
        per_term=False,
        measures="bandwidth",
    ),
    Signal(
        # The GPU resource names the cluster's pods hold, whatever the selection: a patch asks
        # for the names the cluster's device plugin offers (MIG's mixed or single strategy).
        "resources",
        "count by ({K}resource, mig_profile) (last_over_time(gpu_allocation_info[{w}]))",
        per_term=False,
    ),
    Signal(
        "autoscalers",
        "max by ({H}, scaletargetref_kind, scaletargetref_name) "
        "(last_over_time(kube_horizontalpodautoscaler_info{{{m}}}[{w}]))",
        per_term=False,
    ),
    Signal(
        "autoscaler_min",
        "max by ({H}) (last_over_time(kube_horizontalpodautoscaler_spec_min_replicas{{{m}}}[{w}]))",
        per_term=False,
        measures="replicas",
    ),
    Signal(
        "autoscaler_max",
        "max by ({H}) (last_over_time(kube_horizontalpodautoscaler_spec_max_replicas{{{m}}}[{w}]))",
        per_term=False,
        measures="replicas",
    ),
    Signal(
        "autoscaler_metrics",
        "max by ({H}, metric_name, metric_target_type) "
        "(last_over_time(kube_horizontalpodautoscaler_spec_target_metric{{{m}}}[{w}]))",
        per_term=False,
    ),
)


def render(
    signal: Signal,
    *,
    selection: Selection,
    window: float,
    step: float,
    quantile: float,
    pods: Iterable[tuple[str, str]] = (),
    cluster_label: str | None = None,
) -> str:
    """The PromQL of one signal for this selection, window, step and quantile; `pods` are the
    (namespace, pod) pairs the per-pod signals ask about."""
    w, s = format_duration(window), format_duration(step)
    m = selection.matchers()
    found = sorted(set(pods))
    namespaces = sorted({namespace for namespace, _ in found})
    names = sorted({pod for _, pod in found})
    grouping = Grouping(cluster_label)
    return signal.template.format(
        D=", ".join(grouping.device),
        U=", ".join(grouping.uuid),
        C=", ".join(grouping.container),
        H=", ".join(grouping.autoscaler),
        K=f"{cluster_label}, " if cluster_label else "",
        m=m,
        w=w,
        s=s,
        c=format_duration(max(step, min(SHARING_STEP, window))),
        q=f"{quantile:g}",
        f=selection.pod_filter(w, cluster_label=cluster_label),
        pods=f'namespace=~"{_alternatives(namespaces)}", pod=~"{_alternatives(names)}"',
    )


def _alternatives(values: list[str]) -> str:
    return promql_string("|".join(re.escape(value) for value in values))


MAX_POD_MATCHER_BYTES: Final = 8 * 1024
"""How long the pod and namespace matchers of one per-pod query may grow. A cluster's pods do
not fit in one query: VictoriaMetrics refuses queries over 16 KiB by default
(`-search.maxQueryLen`), proxies and servers limit a request's size, and one regex of 10,000
alternatives is slow to compile. Per-pod signals are asked in batches this size (`pod_batches`),
each a query of its own under `--prometheus.concurrency`."""


def pod_batches(
    pods: Iterable[tuple[str, str]], limit: int = MAX_POD_MATCHER_BYTES
) -> list[list[tuple[str, str]]]:
    """The (namespace, pod) pairs, sorted, in batches whose rendered matchers (`{pods}`) take at
    most `limit` bytes (a pair longer than that alone is a batch of its own)."""
    batches: list[list[tuple[str, str]]] = []
    batch: list[tuple[str, str]] = []
    namespaces: set[str] = set()
    size = 0
    for namespace, pod in sorted(set(pods)):
        cost = len(_alternatives([pod])) + 1
        if namespace not in namespaces:
            cost += len(_alternatives([namespace])) + 1
        if batch and size + cost > limit:
            batches.append(batch)
            batch, namespaces = [], set()
            size = 0
            cost = len(_alternatives([pod])) + len(_alternatives([namespace])) + 2
        batch.append((namespace, pod))
        namespaces.add(namespace)
        size += cost
    if batch:
        batches.append(batch)
    return batches
