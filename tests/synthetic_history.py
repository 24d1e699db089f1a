"""Synthetic GPU usage history whose right answer is known, as OpenMetrics for promtool backfill.

Each `FakeWorkload` describes what its pods did — utilization, memory, SM/tensor/DRAM activity,
CPU against its limit — as `Wave`s (a level, a daily swing and a little deterministic jitter).
`write_openmetrics` turns that into the series the daemon (and cAdvisor, kube-state-metrics,
the calibration job) would have exported, sampled every `interval`, each family together, ending
with `# EOF`; `backfill` runs `promtool tsdb create-blocks-from openmetrics` on it.
Also used by `benchmarks/rightsize.py` to build 1,000 workloads.
"""

from __future__ import annotations

import math
import random
import subprocess
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from typing import TextIO

GIB = 1024**3
TARGET = {"job": "gpuscope", "instance": "10.0.0.7:9455"}
"""Labels a scrape adds; the queries must aggregate them away."""
RESTARTED_INSTANCE = "10.0.0.9:9455"


@dataclass(frozen=True)
class Wave:
    """level + amplitude x sin(2 pi t / period) + uniform jitter in [-jitter, jitter], and
    `rise` more from the unix time `rise_from` on (demand going up)."""

    level: float
    amplitude: float = 0.0
    period: float = 86400.0
    jitter: float = 0.0
    rise: float = 0.0
    rise_from: float = math.inf

    def at(self, t: float, rng: random.Random, *, low: float = 0.0, high: float = 1.0) -> float:
        value = self.level + self.amplitude * math.sin(2 * math.pi * t / self.period)
        if t >= self.rise_from:
            value += self.rise
        if self.jitter:
            value += self.jitter * (2 * rng.random() - 1)
        return min(max(value, low), high)


@dataclass(frozen=True)
class FakeWorkload:
    namespace: str
    name: str
    kind: str = "Deployment"
    model: str = "NVIDIA H100 80GB HBM3"
    mig_profile: str | None = None
    pods: int = 1
    gpus_per_pod: int = 1
    busy: Wave | None = None
    """None: the pod holds the GPU but never runs a process on it."""
    memory_gib: Wave | None = None
    sm: Wave | None = None
    tensor: Wave | None = None
    dram: Wave | None = None
    cpu_limit: float | None = None
    cpu_usage: Wave | None = None
    """Cores used by the main container (capped at the limit, as CFS does)."""
    shared_uuid: str | None = None
    """Pods of workloads naming the same uuid time-slice one GPU."""
    hours: float | None = None
    """History length; None = the whole generated span."""
    daemon_restart_hours: float | None = None
    """The daemon on this workload's node restarted this many hours before the end: from then on
    its series carry another `instance` label (new series, as after a real restart)."""
    labels: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None
    """A `cluster` label on every series of the workload, as a store of many clusters has it."""
    autoscaler: tuple[int, int, str] | None = None
    """A HorizontalPodAutoscaler (min replicas, max replicas, metric) in kube-state-metrics."""
    idle_gpus: int = 0
    """The last this many GPUs of each pod are held and never used (no process, no memory)."""

    def idle(self, gpu: str) -> bool:
        return self.busy is None or int(gpu) >= self.gpus_per_pod - self.idle_gpus

    def pod_name(self, index: int) -> str:
        return (
            f"{self.name}-{index}"
            if self.kind in {"StatefulSet", "Job"}
            else f"{self.name}-7d9f8-{index:05d}"
        )

    def devices(self) -> list[tuple[str, str, str]]:
        """(pod, gpu index, uuid) for every device the workload holds."""
        found = []
        for pod in range(self.pods):
            for gpu in range(self.gpus_per_pod):
                digest = zlib.crc32(_key(self, f"{self.namespace}/{self.name}").encode())
                uuid = self.shared_uuid or f"GPU-{digest:08x}-{pod}-{gpu}"
                if self.mig_profile and not self.shared_uuid:
                    uuid = "MIG" + uuid[3:]
                found.append((self.pod_name(pod), str(gpu), uuid))
        return found


def _clustered(w: FakeWorkload, labels: dict[str, str]) -> dict[str, str]:
    return labels | {"cluster": w.cluster} if w.cluster else labels


def _key(w: FakeWorkload, key: str) -> str:
    """A random sequence's or counter's key, apart per cluster."""
    return f"{w.cluster}/{key}" if w.cluster else key


def _labels(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}"


def _times(workload: FakeWorkload, start: float, end: float, interval: float) -> list[float]:
    first = start if workload.hours is None else max(start, end - workload.hours * 3600)
    count = int((end - first) // interval) + 1
    return [end - (count - 1 - i) * interval for i in range(count)]


def write_openmetrics(
    out: TextIO,
    workloads: list[FakeWorkload],
    *,
    end: float,
    duration: float,
    interval: float = 60.0,
    calibration: dict[str, tuple[dict[str, float], float]] | None = None,
    seed: int = 1,
    chunk: tuple[float, float] | None = None,
    state: dict[str, tuple[random.Random, float]] | None = None,
) -> None:
    """Write every family, each together, then `# EOF`. `calibration` maps an NVML model name to
    ({dtype: FLOP/s}, memory bytes/s) exported beside each GPU of that model.

    With `chunk=(start, stop)` only samples in [start, stop) are written; passing the same `state`
    to consecutive chunks continues every counter and random sequence, so a long history can be
    written and backfilled piece by piece."""
    start = end - duration
    chunk_start, chunk_stop = chunk or (start, end + 1)
    carried: dict[str, tuple[random.Random, float]] = {} if state is None else state

    def times(w: FakeWorkload) -> list[float]:
        return [t for t in _times(w, start, end, interval) if chunk_start <= t < chunk_stop]

    def device_labels(w: FakeWorkload, pod: str, gpu: str, uuid: str) -> dict[str, str]:
        labels = {
            "namespace": w.namespace,
            "pod": pod,
            "container": "main",
            "workload": w.name,
            "workload_kind": w.kind,
            "gpu": gpu,
            "uuid": uuid,
            "model": w.model,
        }
        if w.mig_profile:
            labels |= {"mig_profile": w.mig_profile, "gpu_instance": "1"}
        return _clustered(w, labels | TARGET)

    def series(
        name: str, kind: str, rows: Iterator[tuple[dict[str, str], Iterator[tuple[float, float]]]]
    ) -> None:
        family = name.removesuffix("_total") if kind == "counter" else name
        out.write(f"# TYPE {family} {kind}\n")
        for labels, points in rows:
            prefix = name + _labels(labels) + " "
            switch = (
                restarts.get(labels.get("uuid") or labels.get("pod", ""))
                if labels.get("job") == TARGET["job"]
                else None
            )
            if switch is None:
                out.write("".join(f"{prefix}{value:.6g} {t:.0f}\n" for t, value in points))
                continue
            later = name + _labels(labels | {"instance": RESTARTED_INSTANCE}) + " "
            out.write(
                "".join(
                    f"{prefix if t < switch else later}{value:.6g} {t:.0f}\n" for t, value in points
                )
            )

    def each_device(only_busy: bool = False) -> Iterator[tuple[FakeWorkload, str, str, str]]:
        for w in workloads:
            for pod, gpu, uuid in w.devices():
                if not (only_busy and w.idle(gpu)):
                    yield w, pod, gpu, uuid

    def constant(w: FakeWorkload, value: float) -> Iterator[tuple[float, float]]:
        return ((t, value) for t in times(w))

    def gauge(
        w: FakeWorkload, wave: Wave, key: str, scale: float = 1.0, high: float = 1.0
    ) -> Iterator[tuple[float, float]]:
        rng, _ = carried.setdefault(key, (random.Random(f"{seed}/{key}"), 0.0))
        return ((t, wave.at(t, rng, high=high) * scale) for t in times(w))

    def counter(
        w: FakeWorkload, wave: Wave, key: str, high: float = 1.0
    ) -> Iterator[tuple[float, float]]:
        rng, total = carried.get(key, (random.Random(f"{seed}/{key}"), 0.0))
        for t in times(w):
            yield t, total
            total += wave.at(t, rng, high=high) * interval
        carried[key] = (rng, total)

    restarts = {
        key: end - w.daemon_restart_hours * 3600
        for w in workloads
        if w.daemon_restart_hours is not None
        for pod, _, uuid in w.devices()
        for key in (pod, uuid)
    }
    holders: dict[str, int] = {}
    for _, _, _, uuid in each_device():
        holders[uuid] = holders.get(uuid, 0) + 1

    series(
        "gpu_allocation_info",
        "gauge",
        (
            (device_labels(w, p, g, u) | {"resource": _resource(w)}, constant(w, 1))
            for w, p, g, u in each_device()
        ),
    )
    series(
        "gpu_allocation_in_use",
        "gauge",
        (
            (
                device_labels(w, p, g, u) | {"resource": _resource(w)},
                constant(w, 0 if w.idle(g) else 1),
            )
            for w, p, g, u in each_device()
        ),
    )
    series(
        "gpu_allocation_shared",
        "gauge",
        (
            (
                device_labels(w, p, g, u) | {"resource": _resource(w)},
                constant(w, 1 if holders[u] > 1 else 0),
            )
            for w, p, g, u in each_device()
        ),
    )
    series(
        "gpu_pod_busy_seconds_total",
        "counter",
        (
            (device_labels(w, p, g, u), counter(w, w.busy, _key(w, f"busy/{p}/{u}")))
            for w, p, g, u in each_device(True)
            if w.busy
        ),
    )
    series(
        "gpu_pod_memory_used_bytes",
        "gauge",
        (
            (
                device_labels(w, p, g, u),
                gauge(w, w.memory_gib, _key(w, f"mem/{p}/{u}"), GIB, high=1e6),
            )
            for w, p, g, u in each_device(True)
            if w.memory_gib
        ),
    )
    for metric, attribute in (
        ("gpu_sm_active_seconds_total", "sm"),
        ("gpu_tensor_active_seconds_total", "tensor"),
        ("gpu_dram_active_seconds_total", "dram"),
    ):
        series(
            metric,
            "counter",
            (
                (
                    _clustered(w, {"gpu": g, "uuid": u, "model": w.model} | TARGET),
                    counter(w, getattr(w, attribute), _key(w, f"{attribute}/{u}")),
                )
                for w, _, g, u in each_device(True)
                if getattr(w, attribute) is not None
            ),
        )
    pods = {(w.cluster, w.namespace, p): w for w, p, _, _ in each_device()}
    series(
        "gpu_pod_info",
        "gauge",
        (
            (
                _clustered(
                    w,
                    {
                        "namespace": w.namespace,
                        "pod": p,
                        "workload": w.name,
                        "workload_kind": w.kind,
                        "node": "node-a",
                    }
                    | {f"label_{k}": v for k, v in w.labels.items()}
                    | TARGET,
                ),
                constant(w, 1),
            )
            for (_, _, p), w in pods.items()
        ),
    )
    cadvisor = {"job": "kubelet", "instance": "node-a"}
    series(
        "container_cpu_usage_seconds_total",
        "counter",
        (
            (
                _clustered(
                    w,
                    {"namespace": w.namespace, "pod": p, "container": "main", "image": "trainer:1"}
                    | cadvisor,
                ),
                counter(w, w.cpu_usage, _key(w, f"cpu/{p}"), high=w.cpu_limit or 1e6),
            )
            for (_, _, p), w in pods.items()
            if w.cpu_usage is not None
        ),
    )
    ksm = {"job": "kube-state-metrics", "instance": "ksm:8080"}
    series(
        "kube_pod_container_resource_limits",
        "gauge",
        (
            (
                _clustered(
                    w,
                    {
                        "namespace": w.namespace,
                        "pod": p,
                        "container": "main",
                        "resource": "cpu",
                        "unit": "core",
                        "node": "node-a",
                    }
                    | ksm,
                ),
                constant(w, w.cpu_limit),
            )
            for (_, _, p), w in pods.items()
            if w.cpu_limit is not None
        ),
    )
    scaled = [w for w in workloads if w.autoscaler is not None]

    def hpa(w: FakeWorkload, extra: dict[str, str] | None = None) -> dict[str, str]:
        labels = {"namespace": w.namespace, "horizontalpodautoscaler": w.name} | ksm
        return _clustered(w, labels | (extra or {}))

    series(
        "kube_horizontalpodautoscaler_info",
        "gauge",
        (
            (
                hpa(
                    w,
                    {
                        "scaletargetref_api_version": "apps/v1",
                        "scaletargetref_kind": w.kind,
                        "scaletargetref_name": w.name,
                    },
                ),
                constant(w, 1),
            )
            for w in scaled
        ),
    )
    for family, index in (
        ("kube_horizontalpodautoscaler_spec_min_replicas", 0),
        ("kube_horizontalpodautoscaler_spec_max_replicas", 1),
    ):
        series(
            family,
            "gauge",
            ((hpa(w), constant(w, (w.autoscaler or (0, 0, ""))[index])) for w in scaled),
        )
    series(
        "kube_horizontalpodautoscaler_spec_target_metric",
        "gauge",
        (
            (
                hpa(
                    w,
                    {
                        "metric_name": (w.autoscaler or (0, 0, ""))[2],
                        "metric_target_type": "utilization",
                    },
                ),
                constant(w, 70),
            )
            for w in scaled
        ),
    )
    calibrated = calibration or {}
    gpus = {(w.cluster, w.model, g, u): w for w, _, g, u in each_device() if w.model in calibrated}
    series(
        "gpu_calibrated_flops",
        "gauge",
        (
            (
                _clustered(w, {"gpu": g, "uuid": u, "model": model, "dtype": dtype} | TARGET),
                constant(w, flops),
            )
            for (_, model, g, u), w in gpus.items()
            for dtype, flops in calibrated[model][0].items()
        ),
    )
    series(
        "gpu_calibrated_memory_bandwidth_bytes_per_second",
        "gauge",
        (
            (
                _clustered(w, {"gpu": g, "uuid": u, "model": model} | TARGET),
                constant(w, calibrated[model][1]),
            )
            for (_, model, g, u), w in gpus.items()
        ),
    )
    out.write("# EOF\n")


def _resource(w: FakeWorkload) -> str:
    return f"nvidia.com/mig-{w.mig_profile}" if w.mig_profile else "nvidia.com/gpu"


def backfill(
    promtool: str, openmetrics: Path, data_dir: Path, *, max_block_duration: str = "1000h"
) -> None:
    """promtool's blocks from the OpenMetrics file. promtool parses the whole file once per
    block range, so large blocks (the hidden --max-block-duration) make it fast."""
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--quiet",
            f"--max-block-duration={max_block_duration}",
            str(openmetrics),
            str(data_dir),
        ],
        check=True,
        capture_output=True,
        timeout=1800,
    )
