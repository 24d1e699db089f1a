"""The usage history from dcgm-exporter's series and kube-state-metrics' (`--source
dcgm-exporter`): what a cluster that never ran gpuscope already has in Prometheus.

dcgm-exporter labels a GPU a pod holds with the pod (`namespace`, `pod`, `container`; or
`exported_namespace`, `exported_pod`, `exported_container` where the scrape kept the target's own
labels, as kube-prometheus-stack's default ServiceMonitor does), so an idle holder is visible: its
series carry the pod and say 0%. Both generations of names are read, 4.8's and 4.9's (renamed,
some in base units), each step taking whichever the exporter served then, so a window across an
upgrade reads whole:

| what | 4.8 | 4.9 |
|---|---|---|
| utilization | `DCGM_FI_DEV_GPU_UTIL` (%) | `DCGM_FI_DEV_GPU_UTIL_RATIO` (0-1) |
| graphics engine (MIG instances have no utilization) | `DCGM_FI_PROF_GR_ENGINE_ACTIVE` | `DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO` |
| memory used | `DCGM_FI_DEV_FB_USED` (MiB) | `DCGM_FI_DEV_FB_USED_BYTES` |
| SM activity (opt-in) | `DCGM_FI_PROF_SM_ACTIVE` | the same |
| tensor pipes | `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE` | `DCGM_FI_PROF_TENSOR_UTIL_RATIO` |
| DRAM | `DCGM_FI_PROF_DRAM_ACTIVE` | `DCGM_FI_PROF_DRAM_UTIL_RATIO` |

kube-state-metrics says who owns each pod (`kube_pod_owner`, `kube_replicaset_owner`,
`kube_job_owner`, `kube_pod_info`'s `created_by_*` when no owner series exist) and which of its
containers asked for GPUs (`kube_pod_container_resource_requests{resource="nvidia_com_gpu"}`):
only a pod that asked for one holds one (in the `exported_*` form a GPU nobody holds carries the
exporter's own pod). The answers are then translated into the shape gpuscope's signals have
(`history.assemble` makes the history from them), and what dcgm-exporter cannot tell is said in
words (`limits`): every recommendation made from it is at most of medium confidence.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.dcgm_shape import (
    DEVICE_GROUP,
    Cluster,
    cluster_of,
    holder,
    pod_of,
    translate,
)
from exporter.rightsize.history import LONG_TERM, Grouping, History, assemble
from exporter.rightsize.prometheus import PrometheusQueryError, Sample
from exporter.rightsize.selection import promql_string
from exporter.rightsize.signals import SIGNALS, Signal, pod_batches, render
from exporter.rightsize.terms import Answers, ask_terms, with_terms

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from exporter.rightsize.history import Term, WorkloadHistory
    from exporter.rightsize.prometheus import Bounds, PrometheusClient
    from exporter.rightsize.selection import Selection

log = logging.getLogger("exporter.rightsize.history")

MIB: Final = 1024.0 * 1024.0
BUSY: Final = (
    ("DCGM_FI_DEV_GPU_UTIL", 0.01),
    ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1.0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
    ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1.0),
)
"""Utilization first (split per process on shared GPUs since 4.8.2), the graphics engine where
there is none (a MIG instance): (name, factor to a 0-1 ratio)."""
MEMORY: Final = (("DCGM_FI_DEV_FB_USED", MIB), ("DCGM_FI_DEV_FB_USED_BYTES", 1.0))
SM: Final = (("DCGM_FI_PROF_SM_ACTIVE", 1.0),)
TENSOR: Final = (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0), ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1.0))
DRAM: Final = (("DCGM_FI_PROF_DRAM_ACTIVE", 1.0), ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0))
GPU_REQUEST: Final = re.compile(r"nvidia_com_(gpu|mig_.+)")
"""kube-state-metrics' sanitised names of the GPU resources (`nvidia.com/gpu` ->
`nvidia_com_gpu`, `nvidia.com/mig-1g.10gb` -> `nvidia_com_mig_1g_10gb`)."""


@dataclass(frozen=True, slots=True)
class DcgmSignal:
    name: str
    """The gpuscope signal it stands for (`history.assemble` reads it by this name)."""
    template: str
    """PromQL with `{G}` (the device group), `{w}`, `{s}`, `{q}`; `{busy}`, `{memory}`,
    `{memory_peak}`, `{sm}`, `{tensor}`, `{dram}` are each metric at a step, the names of both
    versions joined (`_at_step`)."""
    measures: str
    required: bool = False
    per_term: bool = True


def _at_step(metrics: Iterable[tuple[str, float]], function: str, group: str) -> str:
    """Each step's value of the first of `metrics` the exporter served then, in the first's unit:
    `function` over the step of each, joined by `or` on the device group."""
    parts = []
    for name, factor in metrics:
        part = f"{function}({name}[{{s}}])"
        parts.append(part if factor == 1.0 else f"{part} * {factor!r}")
    return "(" + f" or on ({group}) ".join(parts) + ")"


DCGM_SIGNALS: Final = (
    DcgmSignal(
        "held",
        "sum by ({G}) (count_over_time({memory}[{w}:{s}]))",
        "steps",
        required=True,
    ),
    DcgmSignal(
        "present",
        "max by ({G}) (timestamp({memory_now}))",
        "timestamp",
        required=True,
        per_term=False,
    ),
    DcgmSignal("busy_steps", "sum by ({G}) (count_over_time({busy}[{w}:{s}]))", "steps"),
    DcgmSignal("busy_mean", "max by ({G}) (avg_over_time({busy}[{w}:{s}]))", "ratio"),
    DcgmSignal("busy_quantile", "max by ({G}) (quantile_over_time({q}, {busy}[{w}:{s}]))", "ratio"),
    DcgmSignal(
        "busy_idle_quantile",
        "max by ({G}) (quantile_over_time(0.99, {busy}[{w}:{s}]))",
        "ratio",
    ),
    DcgmSignal("memory_peak", "max by ({G}) (max_over_time({memory_peak}[{w}:{s}]))", "bytes"),
    DcgmSignal(
        "memory_quantile",
        "max by ({G}) (quantile_over_time(0.99, {memory}[{w}:{s}]))",
        "bytes",
    ),
    DcgmSignal("sm_quantile", "max by ({G}) (quantile_over_time({q}, {sm}[{w}:{s}]))", "ratio"),
    DcgmSignal("sm_mean", "max by ({G}) (avg_over_time({sm}[{w}:{s}]))", "ratio"),
    DcgmSignal("tensor_mean", "max by ({G}) (avg_over_time({tensor}[{w}:{s}]))", "ratio"),
    DcgmSignal("dram_mean", "max by ({G}) (avg_over_time({dram}[{w}:{s}]))", "ratio"),
)
KSM_SIGNALS: Final = {
    # Asked about the pods dcgm-exporter named, in batches (`{pods}`), over the whole window.
    "requests": "max by ({K}namespace, pod, container, resource) (max_over_time("
    'kube_pod_container_resource_requests{{resource=~"nvidia_com_.+", {pods}}}[{w}]))',
    "owners": "max by ({K}namespace, pod, owner_kind, owner_name) (last_over_time("
    'kube_pod_owner{{owner_is_controller="true", {pods}}}[{w}]))',
    "created_by": "max by ({K}namespace, pod, created_by_kind, created_by_name) "
    "(last_over_time(kube_pod_info{{{pods}}}[{w}]))",
}
OWNER_SIGNALS: Final = {
    # One series per ReplicaSet or Job of the namespaces the pods are in.
    "replicaset_owners": "max by ({K}namespace, replicaset, owner_kind, owner_name) "
    '(last_over_time(kube_replicaset_owner{{owner_is_controller="true", {namespaces}}}[{w}]))',
    "job_owners": "max by ({K}namespace, job_name, owner_kind, owner_name) "
    '(last_over_time(kube_job_owner{{owner_is_controller="true", {namespaces}}}[{w}]))',
}


def render_dcgm(
    signal: DcgmSignal, *, window: float, step: float, quantile: float, cluster_label: str | None
) -> str:
    """The PromQL of one dcgm-exporter signal over this window and step."""
    group = ", ".join((*Grouping(cluster_label).extra, *DEVICE_GROUP))
    steps = {
        "busy": _at_step(BUSY, "avg_over_time", group),
        "memory": _at_step(MEMORY, "last_over_time", group),
        "memory_peak": _at_step(MEMORY, "max_over_time", group),
        "sm": _at_step(SM, "avg_over_time", group),
        "tensor": _at_step(TENSOR, "avg_over_time", group),
        "dram": _at_step(DRAM, "avg_over_time", group),
    }
    memory_now = f" or on ({group}) ".join(
        name if factor == 1.0 else f"{name} * {factor!r}" for name, factor in MEMORY
    )
    template = signal.template.format(
        G="{G}", w="{w}", s="{s}", q="{q}", memory_now=f"({memory_now})", **steps
    )
    return template.format(
        G=group, w=format_duration(window), s=format_duration(step), q=f"{quantile:g}"
    )


async def source_of_history(client: PrometheusClient, *, end: float, window: float) -> str:
    """`auto`: gpuscope's own series when the window has them, else dcgm-exporter's when it has
    those, else gpuscope (an empty report says no GPU was held); logged with the reason."""
    w = format_duration(window)
    own = await client.query(
        f"count(last_over_time(gpu_allocation_info[{w}]))", at=end, name="source: gpuscope"
    )
    if own and own[0].value > 0:
        log.info("source chosen", extra={"source": "gpuscope", "why": "gpu_allocation_info found"})
        return "gpuscope"
    # One count per name: a function over a selector of several names may drop the names and
    # leave two series with one label set, which a PromQL server refuses.
    theirs = await client.query(
        " or ".join(f"count(last_over_time({name}[{w}]))" for name, _ in (*MEMORY, *BUSY)),
        at=end,
        name="source: dcgm-exporter",
    )
    if theirs and theirs[0].value > 0:
        log.info(
            "source chosen",
            extra={
                "source": "dcgm-exporter",
                "why": f"no gpu_allocation_info in the last {w}, dcgm-exporter's series found",
            },
        )
        return "dcgm-exporter"
    log.info(
        "source chosen",
        extra={
            "source": "gpuscope",
            "why": f"neither gpuscope's nor dcgm-exporter's series in {w}",
        },
    )
    return "gpuscope"


async def ask_window(
    client: PrometheusClient,
    *,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None,
    term: str,
    bounds: Mapping[str, Bounds],
) -> tuple[dict[str, list[Sample]], list[str]]:
    """dcgm-exporter's answers over one window, by signal name, and the optional ones that
    failed (`term` names the window in logs)."""
    suffix = "" if term == LONG_TERM else f" ({term})"
    signals = [s for s in DCGM_SIGNALS if s.per_term or term == LONG_TERM]

    async def ask(signal: DcgmSignal) -> list[Sample] | None:
        promql = render_dcgm(
            signal, window=window, step=step, quantile=quantile, cluster_label=cluster_label
        )
        try:
            return await client.query(
                promql,
                at=end,
                name=f"dcgm-exporter {signal.name}{suffix}",
                bounds=bounds[signal.measures],
                signal=f"dcgm-exporter {signal.name}",
            )
        except PrometheusQueryError as error:
            if signal.required:
                raise
            log.warning(
                "optional signal unavailable",
                extra={"signal": signal.name + suffix, "error": str(error)},
            )
            return None

    found = await asyncio.gather(*(ask(signal) for signal in signals))
    answers = {s.name: samples or [] for s, samples in zip(signals, found, strict=True)}
    missing = [s.name for s, samples in zip(signals, found, strict=True) if samples is None]
    return answers, missing


async def askcluster_of(
    client: PrometheusClient,
    held: Iterable[Sample],
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None,
) -> Cluster:
    """kube-state-metrics' (and cAdvisor's) answers about the pods dcgm-exporter named."""
    grouping = Grouping(cluster_label)
    pods = {
        (namespace, pod)
        for sample in held
        for namespace, pod, _ in (holder(sample.labels),)
        if pod and namespace.isprintable() and pod.isprintable()
    }
    batches = pod_batches(pods)
    namespaces = sorted({namespace for namespace, _ in pods})
    k = f"{cluster_label}, " if cluster_label else ""
    w = format_duration(window)

    async def optional(promql: str, name: str) -> list[Sample] | None:
        try:
            return await client.query(promql, at=end, name=name)
        except PrometheusQueryError as error:
            log.warning("optional signal unavailable", extra={"signal": name, "error": str(error)})
            return None

    async def batched(name: str, template: str) -> list[Sample] | None:
        answers = await asyncio.gather(
            *(
                optional(template.format(K=k, w=w, pods=_pod_matchers(batch)), name)
                for batch in batches
            )
        )
        if any(answer is None for answer in answers):
            return None
        return [sample for answer in answers for sample in answer or ()]

    names = _alternatives(namespaces)
    found = await asyncio.gather(
        *(batched(name, template) for name, template in KSM_SIGNALS.items()),
        *(
            optional(template.format(K=k, w=w, namespaces=f'namespace=~"{names}"'), name)
            for name, template in OWNER_SIGNALS.items()
        ),
    )
    answers = dict(zip([*KSM_SIGNALS, *OWNER_SIGNALS], found, strict=True))
    cpu_signals = [s for s in SIGNALS if s.per_pod]

    async def cpu(signal: Signal) -> list[Sample]:
        promqls = [
            render(
                signal,
                selection=selection,
                window=window,
                step=step,
                quantile=quantile,
                pods=batch,
                cluster_label=cluster_label,
            )
            for batch in batches
        ]
        got = await asyncio.gather(*(optional(promql, signal.name) for promql in promqls))
        return [sample for answer in got for sample in answer or ()]

    cpu_answers = await asyncio.gather(*(cpu(signal) for signal in cpu_signals))
    requests: dict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)
    for sample in answers["requests"] or ():
        resource = sample.labels.get("resource", "")
        if sample.value > 0 and GPU_REQUEST.fullmatch(resource):
            key = (*cluster_of(sample.labels, grouping), *pod_of(sample.labels))
            requests[key].add((sample.labels.get("container", ""), resource))
    return Cluster(
        requests=requests,
        owners=_owners(answers, grouping),
        cpu={s.name: samples for s, samples in zip(cpu_signals, cpu_answers, strict=True)},
        known=frozenset(
            name for name in ("requests", "owners") if answers[name] and (answers[name] or [])
        ),
    )


def _owners(
    answers: Mapping[str, list[Sample] | None], grouping: Grouping
) -> dict[tuple[str, ...], tuple[str, str]]:
    """(cluster, namespace, pod) -> its workload: a ReplicaSet's Deployment, a Job's CronJob."""
    parents: dict[tuple[str, ...], tuple[str, str]] = {}
    for name, child in (("replicaset_owners", "replicaset"), ("job_owners", "job_name")):
        kind = "ReplicaSet" if child == "replicaset" else "Job"
        for sample in answers[name] or ():
            labels = sample.labels
            if labels.get("owner_kind") and labels.get("owner_name"):
                key = (
                    *cluster_of(labels, grouping),
                    labels.get("namespace", ""),
                    kind,
                    labels.get(child, ""),
                )
                parents[key] = (labels["owner_kind"], labels["owner_name"])
    owners: dict[tuple[str, ...], tuple[str, str]] = {}
    for name, kind_label, name_label in (
        ("created_by", "created_by_kind", "created_by_name"),
        ("owners", "owner_kind", "owner_name"),
    ):
        for sample in answers[name] or ():
            labels = sample.labels
            kind, owner = labels.get(kind_label, ""), labels.get(name_label, "")
            if not kind or not owner or kind == "<none>":
                continue
            cluster = cluster_of(labels, grouping)
            namespace = labels.get("namespace", "")
            kind, owner = parents.get((*cluster, namespace, kind, owner), (kind, owner))
            owners[(*cluster, *pod_of(labels))] = (kind, owner)
    return owners


def _alternatives(values: Iterable[str]) -> str:
    return promql_string("|".join(re.escape(value) for value in sorted(values)))


def _pod_matchers(batch: Iterable[tuple[str, str]]) -> str:
    pairs = list(batch)
    namespaces = _alternatives({namespace for namespace, _ in pairs})
    pods = _alternatives({pod for _, pod in pairs})
    return f'namespace=~"{namespaces}", pod=~"{pods}"'


async def fetch_dcgm(
    client: PrometheusClient,
    *,
    selection: Selection,
    end: float,
    window: float,
    step: float,
    quantile: float,
    cluster_label: str | None,
    terms: Sequence[Term],
) -> History:
    """The history from dcgm-exporter's and kube-state-metrics' series: the whole window and each
    shorter term (kube-state-metrics asked once, about the window's pods)."""

    async def over(seconds: float, name: str) -> tuple[Answers, list[str]]:
        bounds = {
            measure: Signal("bounds", "", measures=measure).bounds(seconds, step)
            for measure in {signal.measures for signal in DCGM_SIGNALS}
        }
        return await ask_window(
            client,
            end=end,
            window=seconds,
            step=step,
            quantile=quantile,
            cluster_label=cluster_label,
            term=name,
            bounds=bounds,
        )

    asked = await ask_terms(client, over, end=end, window=window, step=step, terms=terms)
    cluster = await askcluster_of(
        client,
        asked.answers["held"],
        selection=selection,
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        cluster_label=cluster_label,
    )
    shaped, limits = translate(
        asked.answers,
        cluster,
        selection=selection,
        window=window,
        step=step,
        cluster_label=cluster_label,
    )
    history = assemble(
        shaped,
        end=end,
        window=window,
        step=step,
        quantile=quantile,
        missing_signals=asked.missing,
        cluster_label=cluster_label,
    )

    def term_workloads(term: Term, answers: Answers) -> tuple[WorkloadHistory, ...]:
        term_shaped, _ = translate(
            answers,
            cluster,
            selection=selection,
            window=term.seconds,
            step=step,
            cluster_label=cluster_label,
        )
        return assemble(
            term_shaped,
            end=end,
            window=term.seconds,
            step=step,
            quantile=quantile,
            cluster_label=cluster_label,
        ).workloads

    return replace(
        with_terms(history, asked, term_workloads),
        source="dcgm-exporter",
        limits=tuple(limits),
    )
