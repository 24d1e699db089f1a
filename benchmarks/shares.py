"""What reading reserved shares costs the join: one cycle of `exporter.attribution.join.Join` on a
node whose GPUs are handed out in fractions, against the same node time-sliced; prints one JSON
document.

    .venv/bin/python benchmarks/shares.py                 # 8 GPUs, 10 holders each, 500 cycles
    .venv/bin/python benchmarks/shares.py --holders 20 --cycles 2000

The fractional node: GPUs 0-3 to HAMi pods (`hami.io/vgpu-devices-allocated`, each holder
`100 // holders` cores, listed by the kubelet under HAMi's slot ids `<uuid>-<n>`), GPUs 4-7 to KAI
GPU groups (a reservation pod holding the GPU, `holders` pods with a `gpu-fraction`). The
time-sliced node: the same number of pods, each holding a `<uuid>::<n>` replica. Each pod runs one
process on its GPU. Reported: the median and 95th percentile of a cycle's join on each node (the
sampler calls it once a cycle) in microseconds of the thread's CPU time (wall time on a shared
machine measures the neighbours), and the pods and allocations joined.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-in pods live in tests/

from exporter.attribution.cgroups import ContainerRef  # noqa: E402
from exporter.attribution.join import Join  # noqa: E402
from exporter.attribution.pod import PodIndex, pod_from_api  # noqa: E402
from exporter.attribution.podresources import DeviceAllocation  # noqa: E402
from exporter.model import GpuIdentity, GpuSample, KubernetesStatus, ProcessSample  # noqa: E402
from exporter.readings import ENERGY  # noqa: E402
from exporter.readings.device import MEMORY_TOTAL  # noqa: E402
from tests.fake_kube.pods import pod  # noqa: E402
from tests.proc_fixture import container_id, pod_uid  # noqa: E402

GPUS = 8
GPU = "nvidia.com/gpu"
KUBE = KubernetesStatus((), pods_cached=0)


def node(
    holders: int, *, fractional: bool
) -> tuple[PodIndex, tuple[DeviceAllocation, ...], dict[int, ContainerRef], list[GpuIdentity]]:
    gpus = [GpuIdentity(n, f"GPU-{n:04d}-bench", "NVIDIA H100 80GB HBM3") for n in range(GPUS)]
    documents: list[dict[str, Any]] = []
    allocations: list[DeviceAllocation] = []
    containers: dict[int, ContainerRef] = {}
    number = 0
    for gpu in gpus:
        kai = fractional and gpu.index >= GPUS // 2
        group = {"runai-gpu-group": f"group-{gpu.index}"}
        if kai:
            name = f"reservation-{gpu.index}"
            documents.append(
                pod(
                    name,
                    pod_uid(9000 + gpu.index),
                    namespace="kai-resource-reservation",
                    labels={"app": "kai-resource-reservation", **group},
                )
            )
            allocations.append(
                DeviceAllocation("kai-resource-reservation", name, "main", GPU, gpu.uuid)
            )
        for slot in range(holders):
            number += 1
            name = f"pod-{number}"
            annotations: dict[str, str] = {}
            labels: dict[str, str] = {}
            device = f"{gpu.uuid}::{slot}"
            if fractional and not kai:
                cores = 100 // holders
                annotations = {"hami.io/vgpu-devices-allocated": f"{gpu.uuid},NVIDIA,0,{cores}:;"}
                device = f"{gpu.uuid}-{slot}"
            elif kai:
                annotations, labels = {"gpu-fraction": f"{1 / holders:.4f}"}, group
            documents.append(
                pod(
                    name,
                    pod_uid(number),
                    containers={"main": container_id(number)},
                    labels=labels,
                    annotations=annotations,
                )
            )
            if not kai:
                allocations.append(DeviceAllocation("default", name, "main", GPU, device))
            containers[number] = ContainerRef(pod_uid(number), container_id(number))
    index = PodIndex.of(pod_from_api(document) for document in documents)
    return index, tuple(allocations), containers, gpus


def cycles(holders: int, count: int, *, fractional: bool) -> dict[str, Any]:
    index, allocations, containers, gpus = node(holders, fractional=fractional)
    join = Join("bench-node")
    timings: list[float] = []
    result = None
    for cycle in range(count):
        samples = tuple(
            GpuSample(
                gpu,
                up=True,
                values={ENERGY: 1000.0 * cycle, MEMORY_TOTAL: 80 * 2**30},
                processes=tuple(
                    ProcessSample(pid, 2**30, 0.5 / holders, 0.0)
                    for pid in range(1 + gpu.index * holders, 1 + (gpu.index + 1) * holders)
                ),
            )
            for gpu in gpus
        )
        started = time.thread_time()
        result = join(samples, containers, index, allocations, KUBE, now=float(cycle))
        timings.append(time.thread_time() - started)
    assert result is not None
    timings.sort()
    return {
        "pods": len(index.by_name),
        "allocations": len(result.allocations),
        "share_sum_per_gpu": round(sum(a.share for a in result.allocations) / GPUS, 6),
        "median_us": round(statistics.median(timings) * 1e6, 1),
        "p95_us": round(timings[int(0.95 * (len(timings) - 1))] * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holders", type=int, default=10, help="holders per GPU")
    parser.add_argument("--cycles", type=int, default=500)
    args = parser.parse_args()
    print(
        json.dumps(
            {
                "gpus": GPUS,
                "holders_per_gpu": args.holders,
                "cycles": args.cycles,
                "fractional": cycles(args.holders, args.cycles, fractional=True),
                "time_sliced": cycles(args.holders, args.cycles, fractional=False),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
