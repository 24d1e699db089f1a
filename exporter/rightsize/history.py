"""Usage history from Prometheus: one PromQL template per signal, aggregated inside Prometheus.

Every signal is one instant query at the end of the window; statistics over time come from
`*_over_time` functions over the raw samples or over subqueries (`[14d:5m]`), so Prometheus
returns one number per GPU a pod held instead of 4,000 points. Utilization comes from the
integrated counters: `rate(gpu_pod_busy_seconds_total[STEP])` evaluated every STEP is the exact
average of each slice, whatever the scrape interval (at most half of STEP), and `increase` over
the window is the exact busy time.

Aggregations (`sum by`, `max by`, joins) sit outside the `*_over_time` functions: inside a
subquery Prometheus would evaluate them at every one of its 4,000 steps, which costs ten times
more than the rest of the query. Joins that would need them per step (device activity onto the
pod holding the device) happen in `assemble`, in Python, by uuid. One device's series can be
split in time (the daemon restarted and the scrape's `instance` label changed), so counts and
increases add up across series (`sum by`) while percentiles and peaks take the largest (`max by`).

Results are keyed per device a pod held (namespace, workload_kind, workload, pod, uuid) and then
grouped per workload. A signal whose series do not exist (no GPM on Ampere, no cAdvisor, no
calibration) simply leaves its fields `None`; an optional signal whose query fails is reported
in `History.missing_signals` and costs only its own fields.

With a cluster label (`--cluster-label cluster`, for Thanos, Mimir or VictoriaMetrics holding
many clusters) every grouping and join carries it too, so two clusters' `ml/trainer` are two
workloads. Besides the window, the signals a strategy needs are asked again over the shorter
terms (the last day and week, as Kruize's short and medium terms), so a recommendation can say
where demand is going; a term's query that fails costs only that term. Once per run the job also
reads which GPU resource names the cluster's pods hold (`gpu_allocation_info{resource}`: the
names a patch must use) and kube-state-metrics' HorizontalPodAutoscalers.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

from exporter.durations import format_duration
from exporter.rightsize.prometheus import ANY_FINITE, Bounds, PrometheusQueryError
from exporter.rightsize.selection import promql_string

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping, Sequence

    from exporter.rightsize.prometheus import PrometheusClient, Sample
    from exporter.rightsize.selection import Selection

log = logging.getLogger("exporter.rightsize.history")

DEVICE_LABELS: Final = ("namespace", "workload_kind", "workload", "pod", "uuid")
CONTAINER_LABELS: Final = ("namespace", "pod", "container")
IDLE_QUANTILE: Final = 0.99
"""A GPU is idle when even this quantile of its utilization stays under the idle threshold."""
MEMORY_QUANTILE: Final = 0.99
SHARING_STEP: Final = 3600.0
"""Resolution at which the pods time-slicing a GPU are counted (a per-step count is costly)."""
AUTOSCALER_LABELS: Final = ("namespace", "horizontalpodautoscaler")


class Term(NamedTuple):
    """A span of history ending where the window ends, recommended on separately."""

    name: str
    seconds: float


TERMS: Final = (Term("short_term", 86400.0), Term("medium_term", 7 * 86400.0))
"""The shorter terms beside the whole window (`long_term`), as Kruize names them: the last day
and the last week. A term as long as the window, or longer, is the window itself."""
LONG_TERM: Final = "long_term"


@dataclass(frozen=True, slots=True)
class Grouping:
    """The labels results are grouped and joined by: a workload's device, a GPU, a container;
    with a cluster label, each of them also per cluster."""

    cluster_label: str | None = None

    @property
    def extra(self) -> tuple[str, ...]:
        return (self.cluster_label,) if self.cluster_label else ()

    @property
    def device(self) -> tuple[str, ...]:
        return (*self.extra, *DEVICE_LABELS)

    @property
    def uuid(self) -> tuple[str, ...]:
        return (*self.extra, "uuid")

    @property
    def container(self) -> tuple[str, ...]:
        return (*self.extra, *CONTAINER_LABELS)

    @property
    def autoscaler(self) -> tuple[str, ...]:
        return (*self.extra, *AUTOSCALER_LABELS)

    def cluster(self, labels: Mapping[str, str]) -> str:
        return labels.get(self.cluster_label, "") if self.cluster_label else ""


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


def _expressible(pair: tuple[str, str]) -> bool:
    """Whether a (namespace, pod) can be named in a PromQL string: UTF-8 text (a JSON answer
    can hold a lone surrogate, which no query can name)."""
    try:
        "".join(pair).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


@dataclass(frozen=True, slots=True)
class DeviceHistory:
    """One GPU or MIG instance held by one pod, summarised over the window."""

    uuid: str
    model: str
    """As NVML names it (`NVIDIA H100 80GB HBM3`); a MIG instance carries its parent's model."""
    mig_profile: str | None
    resource: str
    """The resource name the pod was allocated it under (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`,
    a renamed time-sliced resource, ...)."""
    held_seconds: float
    """How long the pod held it within the window (steps held x step)."""
    observed_seconds: float
    """How long there was utilization data for it; `observed / held` is the coverage."""
    present: bool = True
    """Still held at the end of the window."""
    shared: bool = False
    """Time-sliced or MPS-shared with other containers at some point in the window."""
    holders: int = 1
    """Pods sharing it at a time, on average while shared (1 when exclusive)."""
    in_use_ratio: float | None = None
    """Share of the held time during which a process of the pod ran on it."""
    busy_mean: float | None = None
    busy_quantile: float | None = None
    busy_idle_quantile: float | None = None
    memory_peak_bytes: float | None = None
    memory_quantile_bytes: float | None = None
    sm_quantile: float | None = None
    """SM activity at the quantile, when the device was the workload's alone (GPM)."""
    sm_mean: float | None = None
    tensor_mean: float | None = None
    dram_mean: float | None = None
    container: str = ""
    """The container it was allocated to (the one a patch changes)."""


@dataclass(frozen=True, slots=True)
class ContainerCpu:
    container: str
    usage_cores: float | None
    """The strategy's quantile of CPU cores used."""
    limit_cores: float | None


@dataclass(frozen=True, slots=True)
class PodHistory:
    name: str
    devices: tuple[DeviceHistory, ...]
    cpu: tuple[ContainerCpu, ...] = ()

    @property
    def present(self) -> bool:
        """Still holding a GPU at the end of the window."""
        return any(device.present for device in self.devices)


@dataclass(frozen=True, slots=True)
class WorkloadHistory:
    """A workload on one GPU configuration (model and MIG profile): the unit of a recommendation."""

    namespace: str
    kind: str
    name: str
    model: str
    mig_profile: str | None
    pods: tuple[PodHistory, ...]
    cluster: str = ""
    """The cluster label's value (empty without `--cluster-label`)."""
    served_tokens: float | None = None
    """Tokens (prompt + output) its inference servers served over the window, from
    `workload_model:serving_tokens:rate5m`; None when it serves none or holds GPUs of more than
    one configuration (the tokens cannot be told apart between them)."""

    @property
    def devices(self) -> tuple[DeviceHistory, ...]:
        return tuple(device for pod in self.pods for device in pod.devices)

    @property
    def key(self) -> str:
        key = f"{self.namespace}/{self.kind}/{self.name}"
        return f"{self.cluster}/{key}" if self.cluster else key

    @property
    def owner(self) -> tuple[str, str, str, str]:
        """(cluster, namespace, kind, name): the object a patch changes."""
        return (self.cluster, self.namespace, self.kind, self.name)

    @property
    def configuration(self) -> tuple[str, str, str, str, str, str]:
        """The workload on its GPU configuration: how the terms' histories are matched."""
        return (*self.owner, self.model, self.mig_profile or "")


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Measured ceilings from the calibration job, keyed by NVML model name."""

    flops: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(model, dtype) -> FLOP/s."""
    memory_bandwidth: Mapping[str, float] = field(default_factory=dict)
    """model -> bytes per second."""


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """A GPU resource name the cluster's pods held in the window, and what it offers."""

    cluster: str
    resource: str
    mig_profile: str | None
    """The MIG profile of the devices held under it (None for whole GPUs): a MIG device under
    `nvidia.com/gpu` is the device plugin's single strategy."""


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """A HorizontalPodAutoscaler scaling a workload (kube-state-metrics)."""

    name: str
    min_replicas: int | None
    max_replicas: int | None
    metrics: tuple[str, ...] = ()
    """The metrics it scales on (`cpu`, `nvidia_gpu_utilization`, ...)."""


@dataclass(frozen=True, slots=True)
class TermHistory:
    """The workloads over a shorter term, by `WorkloadHistory.configuration`."""

    name: str
    window_seconds: float
    workloads: Mapping[tuple[str, ...], WorkloadHistory]


@dataclass(frozen=True, slots=True)
class History:
    end: float
    window_seconds: float
    step_seconds: float
    quantile: float
    workloads: tuple[WorkloadHistory, ...]
    ceilings: Ceilings = field(default_factory=Ceilings)
    missing_signals: tuple[str, ...] = ()
    """Optional signals whose query failed (their fields are `None` everywhere), and terms that
    could not be read (`short_term`)."""
    terms: tuple[TermHistory, ...] = ()
    resources: tuple[ResourceUse, ...] = ()
    autoscalers: Mapping[tuple[str, str, str, str], Autoscaler] = field(default_factory=dict)
    """By the (cluster, namespace, kind, name) of the workload they scale."""
    cluster_label: str | None = None


async def fetch(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None = None,
    terms: Sequence[Term] = TERMS,
) -> History:
    """Run every signal's query over the window, and the strategy's over each shorter term
    (concurrency bounded by the client), and assemble the history."""
    # One cheap query first, so an unreachable or unauthorized server is one clear error, not
    # dozens of parallel ones.
    await client.query("vector(1)", at=end, name="connectivity check")
    shorter = [term for term in terms if 2 * step <= term.seconds < window]

    async def ask_window(seconds: float, name: str) -> tuple[dict[str, list[Sample]], list[str]]:
        return await _ask_window(
            client,
            [s for s in SIGNALS if s.per_term or name == LONG_TERM],
            selection=selection,
            end=end,
            window=seconds,
            step=step,
            quantile=quantile,
            cluster_label=cluster_label,
            term=name,
        )

    async def ask_term(term: Term) -> tuple[dict[str, list[Sample]], list[str]] | None:
        try:
            return await ask_window(term.seconds, term.name)
        except PrometheusQueryError as error:
            log.warning("term unavailable", extra={"term": term.name, "error": str(error)})
            return None

    term_answers = asyncio.gather(*(ask_term(term) for term in shorter))
    answers, missing = await ask_window(window, LONG_TERM)
    history = assemble(
        answers,
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        missing_signals=tuple(missing),
        cluster_label=cluster_label,
    )
    read: list[TermHistory] = []
    lost: list[str] = []
    for term, found in zip(shorter, await term_answers, strict=True):
        if found is None:
            lost.append(term.name)
            continue
        term_history = assemble(
            found[0],
            end=end,
            window=term.seconds,
            step=step,
            quantile=quantile,
            cluster_label=cluster_label,
        )
        read.append(
            TermHistory(
                term.name,
                term.seconds,
                {w.configuration: w for w in term_history.workloads},
            )
        )
    return History(
        end=history.end,
        window_seconds=history.window_seconds,
        step_seconds=history.step_seconds,
        quantile=history.quantile,
        workloads=history.workloads,
        ceilings=history.ceilings,
        missing_signals=(*history.missing_signals, *lost),
        terms=tuple(read),
        resources=history.resources,
        autoscalers=history.autoscalers,
        cluster_label=cluster_label,
    )


async def _ask_window(
    client: PrometheusClient,
    signals: list[Signal],
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None,
    term: str,
) -> tuple[dict[str, list[Sample]], list[str]]:
    """The answers of `signals` over one window, by name, and the optional ones that failed."""
    suffix = "" if term == LONG_TERM else f" ({term})"

    async def ask(
        signal: Signal, pods: Collection[tuple[str, str]] | None = None
    ) -> list[Sample] | None:
        """`signal`'s answer (about `pods` only, for a per-pod one)."""
        promql = render(
            signal,
            selection=selection,
            window=window,
            step=step,
            quantile=quantile,
            pods=pods or (),
            cluster_label=cluster_label,
        )
        asked = frozenset(pods) if pods is not None else None

        def keep(labels: Mapping[str, str]) -> bool:
            # A server answering every batch with every series costs no more than the batch.
            return asked is None or (labels.get("namespace", ""), labels.get("pod", "")) in asked

        try:
            return await client.query(
                promql,
                at=end,
                name=signal.name + suffix,
                keep=keep if asked is not None else None,
                bounds=signal.bounds(window, step),
                signal=signal.name,
            )
        except PrometheusQueryError as error:
            if signal.required:
                raise
            log.warning(
                "optional signal unavailable",
                extra={"signal": signal.name + suffix, "error": str(error)},
            )
            return None

    device_signals = [signal for signal in signals if not signal.per_pod]
    pod_signals = [signal for signal in signals if signal.per_pod]
    held_signal, *other_signals = device_signals
    device_answers = asyncio.gather(*(ask(signal) for signal in other_signals))
    try:
        held = await ask(held_signal)
    except BaseException:
        # The report cannot be made: stop the other queries rather than leave them running.
        device_answers.cancel()
        await asyncio.gather(device_answers, return_exceptions=True)
        raise
    pods = {
        pair
        for s in held or ()
        if _expressible(pair := (s.labels.get("namespace", ""), s.labels.get("pod", "")))
    }
    batches = pod_batches(pods)

    async def ask_batched(signal: Signal) -> list[Sample] | None:
        """A per-pod signal over every batch of pods; None if any batch failed."""
        answers = await asyncio.gather(*(ask(signal, batch) for batch in batches))
        if any(answer is None for answer in answers):
            return None
        return [sample for answer in answers for sample in answer or ()]

    pod_answers = await asyncio.gather(*(ask_batched(signal) for signal in pod_signals if pods))
    answers = {held_signal.name: held}
    answers.update(zip([s.name for s in other_signals], await device_answers, strict=True))
    answers.update(zip([s.name for s in pod_signals if pods], pod_answers, strict=True))
    missing = [name for name, samples in answers.items() if samples is None]
    return {name: samples or [] for name, samples in answers.items()}, missing


def assemble(
    answers: Mapping[str, Iterable[Sample]],
    *,
    end: float,
    window: float,
    step: float,
    quantile: float,
    missing_signals: tuple[str, ...] = (),
    cluster_label: str | None = None,
) -> History:
    """Pure: query answers (by signal name) -> History. Devices come from the `held` signal."""
    grouping = Grouping(cluster_label)
    keys = {
        "cpu_usage_quantile": grouping.container,
        "cpu_limit": grouping.container,
        "sharers": grouping.uuid,
        "sm_quantile": grouping.uuid,
        "sm_seconds": grouping.uuid,
        "tensor_seconds": grouping.uuid,
        "dram_seconds": grouping.uuid,
        "autoscaler_min": grouping.autoscaler,
        "autoscaler_max": grouping.autoscaler,
        "served_tokens": grouping.device[:-2],
    }
    keyed: dict[str, dict[tuple[str, ...], float]] = {}
    for name, samples in answers.items():
        names = keys.get(name, grouping.device)
        keyed[name] = {_key(sample.labels, names): sample.value for sample in samples}

    def get(signal: str, key: tuple[str, ...]) -> float | None:
        return keyed.get(signal, {}).get(key)

    held = [(sample.labels, sample.value) for sample in answers.get("held", ())]
    # Device activity is device-wide: it belongs to a workload only if no other workload held
    # the device within the window.
    workloads_on: dict[tuple[str, ...], set[tuple[str, ...]]] = defaultdict(set)
    for labels, _ in held:
        workloads_on[_key(labels, grouping.uuid)].add(_key(labels, grouping.device[:-2]))

    pods: dict[tuple[str, ...], list[DeviceHistory]] = defaultdict(list)
    for labels, steps in held:
        key = _key(labels, grouping.device)
        gpu = _key(labels, grouping.uuid)
        # A subquery's range includes both ends: one step more than window/step.
        held_seconds = min(steps * step, window)
        shared = bool(get("shared", key))
        in_use = get("in_use", key)
        busy = {
            "busy_quantile": get("busy_quantile", key),
            "busy_idle_quantile": get("busy_idle_quantile", key),
        }
        observed = min((get("busy_steps", key) or 0.0) * step, held_seconds)
        busy_seconds = get("busy_seconds", key)
        if busy["busy_quantile"] is None and in_use == 0:
            # No process ever ran on it, so no busy counter exists: 0% busy, fully observed.
            busy = dict.fromkeys(busy, 0.0)
            observed, busy_seconds = held_seconds, 0.0
        own = not shared and len(workloads_on[gpu]) == 1
        activity = {
            name: get(name, gpu) if own else None
            for name in ("sm_quantile", "sm_seconds", "tensor_seconds", "dram_seconds")
        }
        sharers = get("sharers", gpu)
        device = DeviceHistory(
            uuid=labels.get("uuid", ""),
            model=labels.get("model", ""),
            mig_profile=labels.get("mig_profile") or None,
            resource=labels.get("resource", ""),
            held_seconds=held_seconds,
            observed_seconds=observed,
            present=get("present", key) is not None,
            shared=shared,
            holders=max(2, round(sharers)) if shared and sharers else (2 if shared else 1),
            in_use_ratio=in_use,
            busy_mean=_mean(busy_seconds, held_seconds),
            busy_quantile=busy["busy_quantile"],
            busy_idle_quantile=busy["busy_idle_quantile"],
            memory_peak_bytes=get("memory_peak", key),
            memory_quantile_bytes=get("memory_quantile", key),
            sm_quantile=activity["sm_quantile"],
            sm_mean=_mean(activity["sm_seconds"], held_seconds),
            tensor_mean=_mean(activity["tensor_seconds"], held_seconds),
            dram_mean=_mean(activity["dram_seconds"], held_seconds),
            container=labels.get("container", ""),
        )
        pods[key[:-1]].append(device)

    cpu: dict[tuple[str, ...], list[ContainerCpu]] = defaultdict(list)
    containers = set(keyed.get("cpu_usage_quantile", {})) | set(keyed.get("cpu_limit", {}))
    for container_key in sorted(containers):
        cpu[container_key[:-1]].append(
            ContainerCpu(
                container_key[-1],
                get("cpu_usage_quantile", container_key),
                get("cpu_limit", container_key),
            )
        )

    extra = len(grouping.extra)
    units: dict[tuple[str, ...], list[PodHistory]] = defaultdict(list)
    for pod_key, devices in sorted(pods.items()):
        cluster = pod_key[0] if extra else ""
        namespace, kind, workload, pod = pod_key[extra:]
        configurations: dict[tuple[str, str], list[DeviceHistory]] = defaultdict(list)
        for device in sorted(devices, key=lambda d: d.uuid):
            configurations[(device.model, device.mig_profile or "")].append(device)
        for (model, profile), held_devices in configurations.items():
            # A bare pod (no owning workload) is its own workload.
            unit = (cluster, namespace, kind or "Pod", workload or pod, model, profile)
            units[unit].append(
                PodHistory(
                    pod, tuple(held_devices), tuple(cpu.get((*pod_key[:extra], namespace, pod), ()))
                )
            )

    ceilings = Ceilings(
        flops={
            (s.labels.get("model", ""), s.labels.get("dtype", "")): s.value
            for s in answers.get("calibrated_flops", ())
        },
        memory_bandwidth={
            s.labels.get("model", ""): s.value for s in answers.get("calibrated_bandwidth", ())
        },
    )
    resources = sorted(
        {
            ResourceUse(
                grouping.cluster(s.labels),
                s.labels.get("resource", ""),
                s.labels.get("mig_profile") or None,
            )
            for s in answers.get("resources", ())
            if s.labels.get("resource")
        },
        key=lambda use: (use.cluster, use.resource, use.mig_profile or ""),
    )
    return History(
        end=end,
        window_seconds=window,
        step_seconds=step,
        quantile=quantile,
        workloads=tuple(
            WorkloadHistory(
                namespace=unit[1],
                kind=unit[2],
                name=unit[3],
                model=unit[4],
                mig_profile=unit[5] or None,
                pods=tuple(pod_list),
                cluster=unit[0],
                served_tokens=_served_tokens(keyed, unit, units, extra=extra, step=step),
            )
            for unit, pod_list in sorted(units.items())
        ),
        ceilings=ceilings,
        missing_signals=missing_signals,
        resources=tuple(resources),
        autoscalers=_autoscalers(answers, keyed, grouping),
        cluster_label=cluster_label,
    )


def _served_tokens(
    keyed: Mapping[str, Mapping[tuple[str, ...], float]],
    unit: tuple[str, ...],
    units: Mapping[tuple[str, ...], object],
    *,
    extra: int,
    step: float,
) -> float | None:
    """The tokens the workload of `unit` served over the window, when it has no other GPU
    configuration (its rate summed over the window's steps, times the step)."""
    owner = unit[:4]
    if sum(1 for other in units if other[:4] == owner) != 1:
        return None
    key = unit[:4] if extra else unit[1:4]
    steps = keyed.get("served_tokens", {}).get(key)
    return None if steps is None or steps <= 0 else steps * step


def _autoscalers(
    answers: Mapping[str, Iterable[Sample]],
    keyed: Mapping[str, Mapping[tuple[str, ...], float]],
    grouping: Grouping,
) -> dict[tuple[str, str, str, str], Autoscaler]:
    """kube-state-metrics' HorizontalPodAutoscalers, by the workload they scale."""
    metrics: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for sample in answers.get("autoscaler_metrics", ()):
        name = sample.labels.get("metric_name")
        if name:
            metrics[_key(sample.labels, grouping.autoscaler)].add(name)
    found: dict[tuple[str, str, str, str], Autoscaler] = {}
    for sample in answers.get("autoscalers", ()):
        labels = sample.labels
        kind, target = labels.get("scaletargetref_kind", ""), labels.get("scaletargetref_name", "")
        if not kind or not target:
            continue
        key = _key(labels, grouping.autoscaler)
        low, high = (
            keyed.get("autoscaler_min", {}).get(key),
            keyed.get("autoscaler_max", {}).get(key),
        )
        found[(grouping.cluster(labels), labels.get("namespace", ""), kind, target)] = Autoscaler(
            labels.get("horizontalpodautoscaler", ""),
            None if low is None else round(low),
            None if high is None else round(high),
            tuple(sorted(metrics[key])),
        )
    return found


def _mean(seconds: float | None, held: float) -> float | None:
    """Busy (or active) seconds over the held time, as a ratio."""
    return None if seconds is None or held <= 0 else min(seconds / held, 1.0)


def _key(labels: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in names)
