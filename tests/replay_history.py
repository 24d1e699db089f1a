"""History for the policy replay's known answers, as OpenMetrics for promtool backfill.

Each `Service` is busy at a given level during each step of the report's grid (the level is a
function of the step's number), and every busy counter's increment over a scrape interval is the
level of the step that interval ends in: `rate(gpu_pod_busy_seconds_total[<step>])` at a step's
end is then exactly that step's level, whether the range includes its first sample or not.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

GIB = 1024**3
MODEL = "NVIDIA A100-SXM4-80GB"
TARGET = {"job": "gpuscope", "instance": "10.0.0.7:9455"}


@dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    level: Callable[[int], float]
    """Busy ratio during step k of the grid (k = 0 is the step ending at the window's start)."""
    memory_gib: float
    kind: str = "Deployment"
    shared_uuid: str | None = None

    @property
    def pod(self) -> str:
        return f"{self.name}-0" if self.kind == "StatefulSet" else f"{self.name}-7d9f8-00000"

    @property
    def uuid(self) -> str:
        return self.shared_uuid or f"GPU-{zlib.crc32(f'{self.namespace}/{self.name}'.encode()):08x}"


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def write(
    out: TextIO,
    services: list[Service],
    *,
    end: int,
    steps: int,
    step: int,
    interval: int = 60,
) -> None:
    """`steps` steps of `step` seconds ending at `end`, sampled every `interval` seconds (one
    step more at the start, so the first step's rate has its range)."""
    start = end - (steps + 1) * step
    times = range(start, end + 1, interval)
    holders: dict[str, int] = {}
    for service in services:
        holders[service.uuid] = holders.get(service.uuid, 0) + 1

    def device(service: Service) -> dict[str, str]:
        return {
            "namespace": service.namespace,
            "pod": service.pod,
            "container": "main",
            "workload": service.name,
            "workload_kind": service.kind,
            "gpu": "0",
            "uuid": service.uuid,
            "model": MODEL,
        } | TARGET

    def gauge(name: str, value: Callable[[Service], float], resource: bool = True) -> None:
        out.write(f"# TYPE {name} gauge\n")
        for service in services:
            labels = device(service) | ({"resource": "nvidia.com/gpu"} if resource else {})
            prefix = name + _labels(labels)
            out.write("".join(f"{prefix} {value(service):.6g} {t}\n" for t in times))

    gauge("gpu_allocation_info", lambda _: 1)
    gauge("gpu_allocation_in_use", lambda _: 1)
    gauge("gpu_allocation_shared", lambda s: 1 if holders[s.uuid] > 1 else 0)
    gauge("gpu_pod_memory_used_bytes", lambda s: s.memory_gib * GIB, resource=False)
    out.write("# TYPE gpu_pod_busy_seconds counter\n")
    for service in services:
        prefix = "gpu_pod_busy_seconds_total" + _labels(device(service))
        total = 0.0
        lines = []
        for t in times:
            if t > start:
                # The interval (t - interval, t] lies in step k, the one ending at or after t.
                k = (t - start - 1) // step - 1
                total += service.level(k) * interval
            lines.append(f"{prefix} {total:.6f} {t}\n")
        out.write("".join(lines))
    out.write("# EOF\n")
