"""A holder's share is what it reserved: HAMi's and KAI's annotations, DRA capacity sharing, read
(`exporter.attribution.shares`) and divided per GPU by the join."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from exporter.attribution.cgroups import ContainerRef
from exporter.attribution.claims import claim_consumed
from exporter.attribution.dra import DeviceIndex, slice_from_api
from exporter.attribution.join import Join
from exporter.attribution.pod import PodIndex, pod_from_api, pod_shape
from exporter.attribution.podresources import DeviceAllocation
from exporter.attribution.shares import (
    HAMI_ALLOCATED,
    Reserved,
    ShareError,
    divide,
    hami_devices,
    quantity,
)
from exporter.model import GpuIdentity, GpuSample, KubernetesStatus, ProcessSample
from exporter.readings import ENERGY
from exporter.readings.device import MEMORY_TOTAL
from exporter.rightsize.answer import Sample
from exporter.rightsize.history import History, assemble
from exporter.rightsize.report import build_report
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.signals import SIGNALS
from exporter.rightsize.strategy import STRATEGIES
from tests.fake_kube.pods import pod
from tests.proc_fixture import container_id, pod_uid
from tests.rightsize_data import A100_80, END, WINDOW, device, hardware, workload

if TYPE_CHECKING:
    from exporter.model import Attribution

pytestmark = pytest.mark.timeout(30)

GIB = 2**30
GPU0 = GpuIdentity(0, "GPU-aaaa-0000", "NVIDIA H100 80GB HBM3", minor_number=0)
GPU1 = GpuIdentity(1, "GPU-bbbb-1111", "NVIDIA H100 80GB HBM3", minor_number=1)
GPU2 = GpuIdentity(2, "GPU-cccc-2222", "NVIDIA H100 80GB HBM3", minor_number=2)
KUBE = KubernetesStatus((), pods_cached=0)
GPU = "nvidia.com/gpu"
KAI_GROUP = {"runai-gpu-group": "group-1"}


def hami(devices: str) -> dict[str, str]:
    return {HAMI_ALLOCATED: devices}


def hami_pod(number: int, cores: int, *, uuid: str = GPU0.uuid, mib: int = 20000) -> object:
    return pod(
        f"hami-{number}",
        pod_uid(number),
        namespace="hami",
        containers={"main": container_id(number)},
        annotations=hami(f"{uuid},NVIDIA,{mib},{cores}:;"),
    )


def sample(identity: GpuIdentity, joules: float = 0.0, *busy: tuple[int, float]) -> GpuSample:
    return GpuSample(
        identity,
        up=True,
        values={ENERGY: joules, MEMORY_TOTAL: 80 * GIB},
        processes=tuple(ProcessSample(pid, GIB, value, 0.0) for pid, value in busy),
    )


def shares(result: Attribution) -> dict[tuple[str, str], float]:
    return {(a.pod.name, a.gpu.uuid): a.share for a in result.allocations}


def run(
    pods: list[object],
    allocations: tuple[DeviceAllocation, ...],
    *,
    devices: DeviceIndex | None = None,
    gpus: tuple[GpuSample, ...] = (sample(GPU0), sample(GPU1), sample(GPU2)),
    join: Join | None = None,
) -> Attribution:
    index = PodIndex.of(pod_from_api(document) for document in pods)  # type: ignore[arg-type]
    join = join or Join("gpu-node-1")
    if devices is None:
        return join(gpus, {}, index, allocations, KUBE, now=1.0)
    return join(gpus, {}, index, allocations, KUBE, devices=devices, now=1.0)


# -- reading what was reserved --------------------------------------------------------------------


def test_hamis_annotation_gives_each_container_its_devices_init_containers_first() -> None:
    text = "GPU-a,NVIDIA,10000,30:;;GPU-b,NVIDIA,0,0:GPU-c,NVIDIA,4096,100:;"
    assert hami_devices(text, ("init", "side", "main")) == {
        "init": (Reserved("GPU-a", 10000, 30),),
        "main": (Reserved("GPU-b", 0, 0), Reserved("GPU-c", 4096, 100)),
    }
    # older releases join the containers' lists without a last `;`
    assert hami_devices("GPU-a,NVIDIA,10,25:", ("main",)) == {"main": (Reserved("GPU-a", 10, 25),)}
    assert hami_devices("", ("main",)) == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("GPU-a,NVIDIA,10:", "is not <uuid>,<type>,<MiB>,<cores>"),
        ("GPU-a,NVIDIA,lots,25:", "MiB 'lots' is not a whole number"),
        ("GPU-a,NVIDIA,10,-5:", "cores '-5' is not a whole number"),
        ("GPU-a,NVIDIA,10,150:", "150 cores, more than 100"),
        ("GPU-a,NVIDIA,10,25:;GPU-b,NVIDIA,10,25:;", "2 container lists for a pod of 1"),
    ],
)
def test_a_malformed_hami_annotation_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ShareError, match=problem):
        hami_devices(text, ("main",))


def test_a_share_is_cores_else_memory_of_the_gpus() -> None:
    assert Reserved("GPU-a", 40000, 25).share(80 * GIB) == 0.25
    assert Reserved("GPU-a", 20480, 0).share(80 * GIB) == 0.25
    assert Reserved("GPU-a", 20480, 0).share(None) is None


def test_quantities_as_the_api_writes_them() -> None:
    assert quantity("40Gi") == 40 * GIB
    assert quantity("20G") == 20 * 10**9
    assert quantity("1.5e3") == 1500
    assert quantity("5368709120") == 5 * GIB
    assert quantity("500m") == 1
    with pytest.raises(ShareError, match="is not a quantity"):
        quantity("ten gigs")


def test_shares_never_add_up_to_more_than_the_gpu() -> None:
    assert divide({"a": 0.25, "b": 0.25, "c": None, "d": None}) == (
        {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25},
        0.0,
    )
    assert divide({"a": None, "b": None}) == ({"a": 0.5, "b": 0.5}, 0.0)
    over, claimed = divide({"a": 0.75, "b": 0.75, "c": None})
    assert over == {"a": 0.5, "b": 0.5, "c": 0.0}
    assert claimed == 1.5


def test_the_pod_watch_keeps_the_share_annotations_and_labels_only() -> None:
    shape = pod_shape()
    kept = shape.fields["metadata"].fields["annotations"]  # type: ignore[union-attr]
    assert kept.keep(HAMI_ALLOCATED)
    assert kept.keep("gpu-fraction")
    assert not kept.keep("kubectl.kubernetes.io/last-applied-configuration")
    labels = shape.fields["metadata"].fields["labels"]  # type: ignore[union-attr]
    assert labels.keep("runai-gpu-group")
    assert not labels.keep("team")


# -- HAMi ------------------------------------------------------------------------------------------


def test_four_hami_pods_of_25_cores_hold_one_gpu_in_quarters_by_their_slots() -> None:
    pods = [hami_pod(n, 25) for n in range(1, 5)]
    allocations = tuple(
        DeviceAllocation("hami", f"hami-{n}", "main", GPU, f"{GPU0.uuid}-{n}") for n in range(1, 5)
    )
    result = run(pods, allocations)
    assert shares(result) == {(f"hami-{n}", GPU0.uuid): 0.25 for n in range(1, 5)}
    assert sum(shares(result).values()) == 1.0
    assert all(a.shared for a in result.allocations)


def test_hamis_annotation_wins_over_the_slot_and_memory_counts_without_cores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pods = [hami_pod(1, 0, uuid=GPU1.uuid, mib=20480)]
    slot = (DeviceAllocation("hami", "hami-1", "main", GPU, f"{GPU0.uuid}-3"),)
    with caplog.at_level(logging.DEBUG, logger="exporter.attribution.reserved"):
        result = run(pods, slot)
    assert shares(result) == {("hami-1", GPU1.uuid): 0.25}
    assert "name different GPUs" in caplog.text


def test_a_malformed_hami_annotation_costs_only_that_pods_share(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = pod(
        "broken",
        pod_uid(9),
        namespace="hami",
        containers={"main": container_id(9)},
        annotations=hami("GPU-aaaa-0000,NVIDIA,oops,25:"),
    )
    pods = [hami_pod(1, 50), hami_pod(2, 25), broken]
    allocations = (
        DeviceAllocation("hami", "hami-1", "main", GPU, f"{GPU0.uuid}-0"),
        DeviceAllocation("hami", "hami-2", "main", GPU, f"{GPU0.uuid}-1"),
        DeviceAllocation("hami", "broken", "main", GPU, f"{GPU0.uuid}-2"),
    )
    join = Join("gpu-node-1")
    with caplog.at_level(logging.WARNING):
        run(pods, allocations, join=join)
        result = run(pods, allocations, join=join)
    assert shares(result) == {
        ("hami-1", GPU0.uuid): 0.5,
        ("hami-2", GPU0.uuid): 0.25,
        ("broken", GPU0.uuid): 0.25,  # what the others leave
    }
    warnings = [r for r in caplog.records if HAMI_ALLOCATED in r.getMessage()]
    assert len(warnings) == 1
    assert "MiB 'oops'" in warnings[0].getMessage()
    assert (warnings[0].namespace, warnings[0].pod) == ("hami", "broken")  # type: ignore[attr-defined]


def test_hami_pods_claiming_more_than_a_gpu_are_scaled_down_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pods = [hami_pod(n, 60) for n in (1, 2)]
    allocations = tuple(
        DeviceAllocation("hami", f"hami-{n}", "main", GPU, f"{GPU0.uuid}-{n}") for n in (1, 2)
    )
    with caplog.at_level(logging.WARNING):
        result = run(pods, allocations)
    assert shares(result) == {("hami-1", GPU0.uuid): 0.5, ("hami-2", GPU0.uuid): 0.5}
    assert "reserved more than all of it" in caplog.text


# -- KAI -------------------------------------------------------------------------------------------


def reservation(*, annotations: dict[str, str] | None = None) -> object:
    return pod(
        "gpu-reservation-abc",
        pod_uid(30),
        namespace="kai-resource-reservation",
        containers={"reserve": container_id(30)},
        labels={"app": "kai-resource-reservation", **KAI_GROUP},
        annotations=annotations,
    )


def kai_pod(number: int, annotations: dict[str, str]) -> object:
    return pod(
        f"kai-{number}",
        pod_uid(number),
        namespace="research",
        containers={"side": container_id(number + 50), "main": container_id(number)},
        labels=KAI_GROUP,
        annotations=annotations,
    )


def test_the_kai_reservation_pod_holds_nothing_and_a_half_pod_holds_half() -> None:
    pods = [
        reservation(),
        kai_pod(31, {"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"}),
        kai_pod(32, {"gpu-memory": "20480"}),
    ]
    held = (
        DeviceAllocation(
            "kai-resource-reservation", "gpu-reservation-abc", "reserve", GPU, GPU2.uuid
        ),
    )
    result = run(pods, held)
    assert {(a.pod.name, a.container, a.gpu.uuid, a.share) for a in result.allocations} == {
        ("kai-31", "main", GPU2.uuid, 0.5),
        ("kai-32", "side", GPU2.uuid, 0.25),  # the first container by default
    }
    assert all(use.pod.name != "gpu-reservation-abc" for use in result.usage)
    assert all(p.name != "gpu-reservation-abc" for p in result.pods)


def test_a_kai_group_gpu_is_named_by_the_reservation_annotation_without_its_device() -> None:
    pods = [
        reservation(annotations={"run.ai/reserve_for_gpu_index": GPU1.uuid}),
        kai_pod(31, {"gpu-fraction": "0.5"}),
    ]
    result = run(pods, ())
    assert shares(result) == {("kai-31", GPU1.uuid): 0.5}


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        ({"gpu-fraction": "half"}, "gpu-fraction 'half' is not a number in (0, 1]"),
        ({"gpu-fraction": "1.5"}, "is not a number in (0, 1]"),
        ({"gpu-memory": "lots"}, "gpu-memory (MiB) 'lots' is not a whole number"),
        ({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"}, "names 'nope'"),
    ],
)
def test_a_malformed_kai_annotation_costs_that_pod_its_share(
    caplog: pytest.LogCaptureFixture, annotations: dict[str, str], problem: str
) -> None:
    pods = [reservation(), kai_pod(31, annotations), kai_pod(32, {"gpu-fraction": "0.25"})]
    held = (
        DeviceAllocation(
            "kai-resource-reservation", "gpu-reservation-abc", "reserve", GPU, GPU2.uuid
        ),
    )
    with caplog.at_level(logging.WARNING):
        result = run(pods, held)
    assert shares(result) == {("kai-32", GPU2.uuid): 0.25}
    (warning,) = [r for r in caplog.records if "KAI pod" in r.getMessage()]
    assert problem in warning.getMessage()
    assert warning.pod == "kai-31"  # type: ignore[attr-defined]


# -- DRA capacity sharing and what stays 1/N -----------------------------------------------------


def capacity_slice() -> DeviceIndex:
    return DeviceIndex.of(
        [
            slice_from_api(
                {
                    "spec": {
                        "driver": "gpu.nvidia.com",
                        "pool": {"name": "gpu-node-1", "generation": 1},
                        "devices": [
                            {
                                "name": "gpu-1",
                                "attributes": {"uuid": {"string": GPU1.uuid}},
                                "capacity": {"memory": {"value": "80Gi"}},
                            }
                        ],
                    }
                }
            )
        ]
    )


def test_dra_shares_follow_the_consumed_capacity() -> None:
    claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": "gpu-node-1",
                            "device": "gpu-1",
                            "shareID": "share-a",
                            "consumedCapacity": {"memory": "60Gi"},
                        }
                    ]
                }
            }
        }
    }
    consumed = claim_consumed(claim)
    assert consumed == {("gpu.nvidia.com", "gpu-node-1", "gpu-1", "share-a"): 60 * GIB}
    pods = [
        pod(name, pod_uid(n), containers={"main": container_id(n)})
        for n, name in ((41, "big"), (42, "small"))
    ]
    allocations = (
        DeviceAllocation(
            "default",
            "big",
            "main",
            GPU,
            "gpu-1",
            "gpu.nvidia.com",
            "gpu-node-1",
            "big-gpu",
            "default",
            "share-a",
            60 * GIB,
        ),
        DeviceAllocation(
            "default",
            "small",
            "main",
            GPU,
            "gpu-1",
            "gpu.nvidia.com",
            "gpu-node-1",
            "small-gpu",
            "default",
            "share-b",
            20 * GIB,
        ),
    )
    result = run(pods, allocations, devices=capacity_slice())
    assert shares(result) == {("big", GPU1.uuid): 0.75, ("small", GPU1.uuid): 0.25}


def test_time_sliced_replicas_stay_an_equal_part() -> None:
    pods = [
        pod(name, pod_uid(n), containers={"main": container_id(n)})
        for n, name in ((1, "a"), (2, "b"))
    ]
    allocations = (
        DeviceAllocation("default", "a", "main", GPU, f"{GPU0.uuid}::0"),
        DeviceAllocation("default", "b", "main", GPU, f"{GPU0.uuid}::1"),
        DeviceAllocation("default", "a", "main", GPU, GPU1.uuid),
    )
    result = run(pods, allocations)
    assert shares(result) == {("a", GPU0.uuid): 0.5, ("b", GPU0.uuid): 0.5, ("a", GPU1.uuid): 1.0}


def test_the_idle_energy_of_a_gpu_follows_the_reserved_shares() -> None:
    """Idle: the holders' parts by share; the half nobody reserved is unattributed."""
    pods = [
        reservation(),
        kai_pod(31, {"gpu-fraction": "0.25"}),
        kai_pod(32, {"gpu-fraction": "0.25"}),
    ]
    held = (
        DeviceAllocation(
            "kai-resource-reservation", "gpu-reservation-abc", "reserve", GPU, GPU2.uuid
        ),
    )
    index = PodIndex.of(pod_from_api(document) for document in pods)  # type: ignore[arg-type]
    join = Join("gpu-node-1")
    containers = {31: ContainerRef(pod_uid(31), container_id(31))}
    for now, joules in ((0.0, 1000.0), (1.0, 1400.0)):
        result = join((sample(GPU2, joules, (31, 0.0)),), containers, index, held, KUBE, now=now)
    energy = {(u.pod.name, u.container): u.energy_joules_total for u in result.usage}
    assert energy[("kai-31", "side")] == pytest.approx(100.0)
    assert energy[("kai-32", "side")] == pytest.approx(100.0)
    (unattributed,) = result.unattributed_energy
    assert unattributed.joules_total == pytest.approx(200.0)


# -- rightsizing -----------------------------------------------------------------------------------


def test_rightsizing_costs_a_fractional_holder_what_it_reserved() -> None:
    """Two pods share one A100: 0.75 and 0.25 reserved, not half each."""
    big = device(uuid="GPU-s", model=A100_80, busy=0.2, memory_gib=10, shared=True, holders=2)
    small = replace(big, share=0.25)
    history = History(
        END,
        WINDOW,
        300.0,
        0.95,
        (workload(replace(big, share=0.75), name="big"), workload(small, name="small")),
    )
    report = build_report(
        history,
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="test",
    )
    costs = {row.history.name: row.cost_current for row in report.rows}
    assert costs == {
        "big": pytest.approx(3.43 * 0.75 * 730.0),
        "small": pytest.approx(3.43 * 0.25 * 730.0),
    }


def test_rightsizing_reads_each_devices_share_and_falls_back_to_its_holders() -> None:
    held = {"namespace": "ml", "workload_kind": "Deployment", "workload": "tts", "pod": "tts-1"}
    model = {"model": "NVIDIA H100 80GB HBM3", "resource": "nvidia.com/gpu"}
    answers = {
        "held": [
            Sample({**held, **model, "uuid": "GPU-3"}, 10),
            Sample({**held, **model, "uuid": "GPU-4"}, 10),
        ],
        "shared": [Sample({**held, "uuid": "GPU-3"}, 1), Sample({**held, "uuid": "GPU-4"}, 1)],
        "sharers": [Sample({"uuid": "GPU-3"}, 4), Sample({"uuid": "GPU-4"}, 4)],
        "share": [Sample({**held, "uuid": "GPU-3"}, 0.5)],
    }
    history = assemble(answers, end=1e9, window=3000.0, step=300.0, quantile=0.95)
    (tts,) = history.workloads
    parts = {d.uuid: (d.share, d.part) for d in tts.devices}
    assert parts == {"GPU-3": (0.5, 0.5), "GPU-4": (None, 0.25)}
    share = next(signal for signal in SIGNALS if signal.name == "share")
    assert "gpu_allocation_share_ratio" in share.template
