"""Energy per pod: each cycle's GPU energy divided among the containers on the GPU, the rest
unattributed, the parts always adding up to the GPU's increase (exporter/attribution/join.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.attribution.cgroups import ContainerRef
from exporter.attribution.join import Join
from exporter.attribution.pod import PodIndex, pod_from_api
from exporter.attribution.podresources import DeviceAllocation
from exporter.model import GpuIdentity, GpuSample, KubernetesStatus, ProcessSample, WatchStatus
from exporter.readings import ENERGY
from tests.fake_kube.pods import NODE, pod
from tests.proc_fixture import container_id, pod_uid

if TYPE_CHECKING:
    from exporter.model import Attribution

GPU0 = GpuIdentity(0, "GPU-0000", "NVIDIA H100 80GB HBM3", minor_number=0)
GPU1 = GpuIdentity(1, "GPU-1111", "NVIDIA H100 80GB HBM3", minor_number=1)
MIG = GpuIdentity(
    1,
    "MIG-1111-a",
    "NVIDIA H100 80GB HBM3",
    mig_profile="3g.40gb",
    gpu_instance=1,
    parent_uuid="GPU-1111",
)
KUBE = KubernetesStatus((WatchStatus("pods", True, 0.0, 3),), pods_cached=3)
GPU = "nvidia.com/gpu"
PODS = PodIndex.of(
    pod_from_api(pod(name, pod_uid(n), namespace="ml", containers={"server": container_id(n)}))
    for n, name in ((1, "chat"), (2, "embed"), (3, "notebook"))
)
CONTAINERS = {100 + n: ContainerRef(pod_uid(n), container_id(n)) for n in (1, 2, 3)}
STRAY = 999  # a process outside any pod
TIME_SLICED = (
    DeviceAllocation("ml", "chat", "server", GPU, "GPU-0000::0"),
    DeviceAllocation("ml", "embed", "server", GPU, "GPU-0000::1"),
    DeviceAllocation("ml", "notebook", "server", GPU, "GPU-0000::2"),
)


def sample(
    identity: GpuIdentity,
    joules: float | None,
    *processes: tuple[int, float | None],
    listed: bool = True,
    up: bool = True,
) -> GpuSample:
    """A GPU whose energy counter reads `joules`, running `(pid, utilization)` processes."""
    return GpuSample(
        identity,
        up=up,
        values={ENERGY: joules} if joules is not None else {},
        processes=tuple(ProcessSample(pid, 2**30, busy, 0.0) for pid, busy in processes)
        if listed
        else None,
    )


def energies(result: Attribution) -> dict[tuple[str, str], float | None]:
    return {(use.pod.name, use.gpu.uuid): use.energy_joules_total for use in result.usage}


def unattributed(result: Attribution) -> dict[str, float]:
    return {row.gpu.uuid: row.joules_total for row in result.unattributed_energy}


def run(
    join: Join,
    *cycles: tuple[GpuSample, ...],
    allocations: tuple[DeviceAllocation, ...] = TIME_SLICED,
) -> Attribution:
    result = None
    for number, gpus in enumerate(cycles):
        result = join(gpus, CONTAINERS, PODS, allocations, KUBE, now=float(number))
    assert result is not None
    return result


def test_a_gpu_one_pod_holds_gives_it_all_its_energy_from_the_second_reading() -> None:
    join = Join(NODE)
    alone = (DeviceAllocation("ml", "chat", "server", GPU, "GPU-0000"),)
    first = run(join, (sample(GPU0, 5_000.0, (101, 0.2)),), allocations=alone)
    assert energies(first) == {("chat", "GPU-0000"): 0.0}  # the first reading is the baseline
    result = run(
        join,
        (sample(GPU0, 5_300.0, (101, 0.2)),),
        (sample(GPU0, 5_650.0),),  # its process ended: the idle GPU is still the holder's
        allocations=alone,
    )
    assert energies(result) == {("chat", "GPU-0000"): pytest.approx(650.0)}
    assert unattributed(result) == {"GPU-0000": 0.0}


def test_a_time_sliced_gpu_splits_the_busy_part_by_use_and_the_idle_part_among_holders() -> None:
    join = Join(NODE)
    run(join, (sample(GPU0, 1_000.0),))
    # 600 J: 60% busy (chat 0.4, embed 0.2) = 360 J by use; 240 J idle in thirds to the holders
    result = run(join, (sample(GPU0, 1_600.0, (101, 0.3), (101, 0.1), (102, 0.2)),))
    assert energies(result) == {
        ("chat", "GPU-0000"): pytest.approx(240.0 + 80.0),
        ("embed", "GPU-0000"): pytest.approx(120.0 + 80.0),
        ("notebook", "GPU-0000"): pytest.approx(80.0),
    }
    assert unattributed(result) == {"GPU-0000": 0.0}


def test_processes_outside_pods_keep_their_busy_part_unattributed() -> None:
    join = Join(NODE)
    run(join, (sample(GPU0, 0.0),))
    result = run(join, (sample(GPU0, 1_000.0, (101, 0.5), (STRAY, 0.25)),))
    chat, embed, notebook = (energies(result)[(name, "GPU-0000")] for name in TIME_SLICE_NAMES)
    assert chat == pytest.approx(500.0 + 250.0 / 3)
    assert embed == notebook == pytest.approx(250.0 / 3)
    assert unattributed(result) == {"GPU-0000": pytest.approx(250.0)}


TIME_SLICE_NAMES = ("chat", "embed", "notebook")


def test_more_use_than_the_gpu_has_leaves_no_idle_part() -> None:
    join = Join(NODE)
    run(join, (sample(GPU0, 0.0),))
    result = run(join, (sample(GPU0, 900.0, (101, 0.9), (102, 0.6)),))  # summed to 1.5: capped
    assert energies(result) == {
        ("chat", "GPU-0000"): pytest.approx(540.0),
        ("embed", "GPU-0000"): pytest.approx(360.0),
        ("notebook", "GPU-0000"): 0.0,
    }


def test_a_gpu_nobody_holds_or_runs_on_is_all_unattributed_and_series_need_a_reading() -> None:
    join = Join(NODE)
    result = run(
        join,
        (sample(GPU0, 10.0), sample(GPU1, None)),
        (sample(GPU0, 40.0), sample(GPU1, None)),
        allocations=(),
    )
    assert unattributed(result) == {"GPU-0000": pytest.approx(30.0)}  # no reading, no series
    only_stray = run(join, (sample(GPU0, 70.0, (STRAY, 0.9)), sample(GPU1, None)), allocations=())
    assert unattributed(only_stray) == {"GPU-0000": pytest.approx(60.0)}
    assert energies(only_stray) == {}


def test_pods_running_on_a_gpu_nobody_holds_share_its_idle_part() -> None:
    join = Join(NODE)
    run(join, (sample(GPU0, 0.0),), allocations=())
    result = run(join, (sample(GPU0, 100.0, (101, 0.5), (102, 0.0)),), allocations=())
    assert energies(result) == {
        ("chat", "GPU-0000"): pytest.approx(50.0 + 25.0),
        ("embed", "GPU-0000"): pytest.approx(25.0),
    }


def test_a_reset_the_first_reading_and_a_gap_are_never_negative_and_always_add_up() -> None:
    join = Join(NODE)
    alone = (DeviceAllocation("ml", "chat", "server", GPU, "GPU-0000"),)
    gpu = lambda joules: (sample(GPU0, joules, (101, 0.5)),)  # noqa: E731 - a cycle's GPUs
    result = run(join, gpu(100.0), gpu(200.0), allocations=alone)
    assert energies(result)[("chat", "GPU-0000")] == pytest.approx(100.0)
    result = run(join, gpu(30.0), allocations=alone)  # the driver reloaded: counter restarted
    assert energies(result)[("chat", "GPU-0000")] == pytest.approx(100.0)
    result = run(join, gpu(80.0), allocations=alone)  # counting again from the new baseline
    assert energies(result)[("chat", "GPU-0000")] == pytest.approx(150.0)
    # a cycle without a reading: nothing that cycle, the gap counted unattributed after it
    result = run(join, gpu(None), gpu(180.0), gpu(190.0), allocations=alone)
    assert energies(result)[("chat", "GPU-0000")] == pytest.approx(160.0)
    assert unattributed(result) == {"GPU-0000": pytest.approx(100.0)}


def test_a_gpu_down_or_without_a_process_list_gives_its_energy_to_no_pod() -> None:
    join = Join(NODE)
    alone = (DeviceAllocation("ml", "chat", "server", GPU, "GPU-0000"),)
    run(join, (sample(GPU0, 0.0, (101, 0.5)),), allocations=alone)
    result = run(join, (sample(GPU0, 50.0, listed=False),), allocations=alone)
    assert energies(result) == {("chat", "GPU-0000"): 0.0}
    assert unattributed(result) == {"GPU-0000": pytest.approx(50.0)}
    down = run(join, (sample(GPU0, None, up=False),), allocations=alone)
    assert energies(down) == {}  # no series while down
    assert unattributed(down) == {}
    back = run(
        join,
        (sample(GPU0, 90.0, (101, 0.5)),),
        (sample(GPU0, 95.0, (101, 0.5)),),
        allocations=alone,
    )
    assert energies(back) == {("chat", "GPU-0000"): pytest.approx(5.0)}
    assert unattributed(back) == {"GPU-0000": pytest.approx(90.0)}  # never lower than before


def test_untimed_processes_on_a_shared_gpu_leave_the_cycle_unattributed() -> None:
    join = Join(NODE)
    run(join, (sample(GPU0, 0.0),))
    result = run(join, (sample(GPU0, 60.0, (101, None), (102, 0.2)),))
    assert set(energies(result).values()) == {0.0}
    assert unattributed(result) == {"GPU-0000": pytest.approx(60.0)}
    alone = (DeviceAllocation("ml", "chat", "server", GPU, "GPU-0000"),)
    lone = Join(NODE)
    lone_result = run(
        lone,
        (sample(GPU0, 0.0, (101, None)),),
        (sample(GPU0, 60.0, (101, None)),),
        allocations=alone,
    )
    assert energies(lone_result) == {("chat", "GPU-0000"): pytest.approx(60.0)}  # alone: all


def test_a_mig_gpu_keeps_its_energy_at_gpu_level() -> None:
    join = Join(NODE)
    mig = (DeviceAllocation("ml", "chat", "server", "nvidia.com/mig-3g.40gb", MIG.uuid),)
    parent = GpuIdentity(1, "GPU-1111", "NVIDIA H100 80GB HBM3", minor_number=1)
    cycle = lambda joules: (  # noqa: E731 - a cycle's GPUs
        sample(parent, joules, listed=False),
        sample(MIG, None, (101, None)),
    )
    result = run(join, cycle(1_000.0), cycle(1_400.0), allocations=mig)
    assert energies(result) == {("chat", MIG.uuid): None}  # no energy series on an instance
    assert unattributed(result) == {"GPU-1111": pytest.approx(400.0)}


def test_counters_never_go_down_while_the_pod_lives_and_vanish_with_it() -> None:
    join = Join(NODE)
    seen: list[float] = []
    readings = (0.0, 100.0, 100.0, 50.0, 300.0, 310.0)
    for number, joules in enumerate(readings):
        processes = ((101, 0.3), (102, 0.3)) if number % 2 else ((102, 0.5),)
        result = join(
            (sample(GPU0, joules, *processes),),
            CONTAINERS,
            PODS,
            TIME_SLICED,
            KUBE,
            now=float(number),
        )
        total = energies(result)[("chat", "GPU-0000")]
        assert total is not None
        seen.append(total)
    assert seen == sorted(seen)
    ended = PodIndex.of(p for p in PODS.by_uid.values() if p.name != "chat")
    result = join(
        (sample(GPU0, 400.0, (102, 0.5)),), CONTAINERS, ended, TIME_SLICED[1:], KUBE, now=9.0
    )
    assert ("chat", "GPU-0000") not in energies(result)


def test_parts_add_up_to_the_gpus_increase_over_a_changing_cycle_history() -> None:
    join = Join(NODE)
    history = [
        (0.0, ((101, 0.2),)),
        (120.0, ((101, 0.2), (102, 0.3), (STRAY, 0.1))),
        (None, ()),
        (400.0, ((101, 0.7), (102, 0.6))),
        (390.0, ((103, 0.0),)),
        (700.0, ((101, None), (102, 0.1))),
        (910.0, ()),
        (1_000.0, ((STRAY, 0.4), (103, 0.2))),
    ]
    increase = 0.0
    last: float | None = None
    result = None
    for number, (joules, processes) in enumerate(history):
        result = join(
            (sample(GPU0, joules, *processes),), CONTAINERS, PODS, TIME_SLICED, KUBE, now=number
        )
        if joules is not None:
            if last is not None and joules >= last:
                increase += joules - last
            last = joules
    assert result is not None
    parts = sum(value or 0.0 for value in energies(result).values())
    assert parts + unattributed(result)["GPU-0000"] == pytest.approx(increase)
