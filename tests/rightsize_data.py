"""Plain-data builders for the rightsizing unit tests: histories, hardware and a whole report."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from exporter.catalog import builtin_catalog
from exporter.rightsize.hardware import Hardware, Option
from exporter.rightsize.history import (
    Ceilings,
    ContainerCpu,
    DeviceHistory,
    History,
    PodHistory,
    WorkloadHistory,
)
from exporter.rightsize.replay.engine import CurrentSteps, PolicyResult, Workload, replay
from exporter.rightsize.report import Report, build_report
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.strategy import STRATEGIES

DAY = 86400.0
WINDOW = 14 * DAY
END = 1_790_000_000.0
GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
A100_80 = "NVIDIA A100-SXM4-80GB"
A100_40 = "NVIDIA A100-SXM4-40GB"
L4 = "NVIDIA L4"


def device(
    *,
    uuid: str = "GPU-1",
    model: str = H100,
    mig_profile: str | None = None,
    held: float = WINDOW,
    observed: float | None = None,
    busy: float = 0.5,
    busy_mean: float | None = None,
    busy_p99: float | None = None,
    memory_gib: float = 10.0,
    **extra: Any,
) -> DeviceHistory:
    """One device at a steady `busy` unless told otherwise (quantile = busy, mean = busy)."""
    return DeviceHistory(
        uuid=uuid,
        model=model,
        mig_profile=mig_profile,
        resource=extra.pop(
            "resource", f"nvidia.com/mig-{mig_profile}" if mig_profile else "nvidia.com/gpu"
        ),
        held_seconds=held,
        observed_seconds=held if observed is None else observed,
        in_use_ratio=extra.pop("in_use_ratio", 1.0),
        busy_mean=busy if busy_mean is None else busy_mean,
        busy_quantile=busy,
        busy_idle_quantile=busy if busy_p99 is None else busy_p99,
        memory_peak_bytes=memory_gib * GIB,
        memory_quantile_bytes=memory_gib * GIB,
        **extra,
    )


def workload(
    *devices: DeviceHistory,
    name: str = "app",
    namespace: str = "team",
    kind: str = "Deployment",
    cpu: tuple[ContainerCpu, ...] = (),
    pods: int = 1,
) -> WorkloadHistory:
    """A workload whose devices are split evenly over `pods` pods."""
    first = devices[0]
    per_pod = len(devices) // pods
    return WorkloadHistory(
        namespace=namespace,
        kind=kind,
        name=name,
        model=first.model,
        mig_profile=first.mig_profile,
        pods=tuple(
            PodHistory(f"{name}-{index}", devices[index * per_pod : (index + 1) * per_pod], cpu)
            for index in range(pods)
        ),
    )


def hardware(ceilings: Ceilings | None = None, prices: dict[str, float] | None = None) -> Hardware:
    return Hardware.build(builtin_catalog(), ceilings or Ceilings(), prices)


def settings(**changes: Any) -> StrategySettings:
    return replace(StrategySettings(), **changes)


def sample_workloads() -> tuple[WorkloadHistory, ...]:
    """One workload per classification, on plain data."""
    return (
        workload(
            device(uuid="GPU-idle", busy=0.0, in_use_ratio=0.02, memory_gib=0.0),
            name="notebook",
            namespace="research",
            kind="StatefulSet",
        ),
        workload(
            device(
                uuid="GPU-small",
                model=A100_80,
                busy=0.1,
                memory_gib=6,
                sm_quantile=0.07,
                sm_mean=0.05,
                tensor_mean=0.03,
                dram_mean=0.04,
            ),
            name="chat|small",
            namespace="serving",
        ),
        workload(
            device(uuid="GPU-mem", model=A100_80, busy=0.55, memory_gib=72),
            name="embed",
            namespace="training",
            kind="Job",
        ),
        workload(
            *(
                device(
                    uuid=f"GPU-llm-{i}",
                    busy=0.97,
                    memory_gib=74,
                    sm_quantile=0.92,
                    sm_mean=0.9,
                    tensor_mean=0.75,
                    dram_mean=0.35,
                )
                for i in range(4)
            ),
            name="llm",
            namespace="training",
            kind="Job",
        ),
        workload(
            device(uuid="GPU-starved", model=A100_40, busy=0.4, busy_mean=0.35, memory_gib=18),
            name="resnet",
            namespace="training",
            kind="Job",
            cpu=(ContainerCpu("main", 3.95, 4.0),),
        ),
        workload(device(uuid="GPU-new", held=2 * 3600), name="<new>", namespace="serving"),
        workload(
            device(uuid="GPU-l4", model=L4, busy=0.55, memory_gib=12),
            name="ocr",
            namespace="serving",
        ),
    )


def sample_history() -> History:
    return History(
        end=END,
        window_seconds=WINDOW,
        step_seconds=300.0,
        quantile=0.95,
        workloads=sample_workloads(),
        ceilings=Ceilings(flops={(H100, "bf16"): 800e12}, memory_bandwidth={H100: 3.0e12}),
    )


def sample_report() -> Report:
    return build_report(
        sample_history(),
        strategy=STRATEGIES["simple"],
        hardware=hardware(
            Ceilings(flops={(H100, "bf16"): 800e12}, memory_bandwidth={H100: 3.0e12})
        ),
        settings=StrategySettings(),
        source="http://prometheus.example:9090",
    )


REPLAY_PERIOD = 48
"""Steps in a period of `sample_simulation`'s services: eight slots of six steps."""


def sample_simulation(
    policies: tuple[str, ...] = ("current", "exclusive", "mig", "timeslice", "binpack"),
) -> tuple[PolicyResult, ...]:
    """Eight A100 80GB services whose peaks (39% busy, 15% the rest) never meet, over two
    periods; eight GPUs held over the first period, six over the second."""
    a100 = builtin_catalog().find("a100-sxm4-80gb")
    assert a100 is not None
    steps = 2 * REPLAY_PERIOD
    workloads = [
        Workload(
            "",
            "serving",
            "Deployment",
            f"svc-{service}",
            Option(a100),
            tuple(0.39 if (k % REPLAY_PERIOD) // 6 == service else 0.15 for k in range(steps)),
            10 * GIB,
        )
        for service in range(8)
    ]
    held = tuple(8.0 if k < REPLAY_PERIOD else 6.0 for k in range(steps))
    return replay(
        workloads,
        CurrentSteps(held, {"a100-sxm4-80gb": sum(held)}, 0),
        hardware=hardware(),
        settings=StrategySettings(models=("a100-sxm4-80gb",)),
        policies=policies,
    )
