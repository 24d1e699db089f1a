"""Deeper signals on the simulator: GPM, MIG, XID/ECC events, throttle time, memory health, the
PCIe thread; the event thread's life; the fleet keys that drive them."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.config import ServeConfig
from exporter.metrics.exposition import TEXT
from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import GpuIdentity, GpuSample, ProcessSample, Snapshot
from exporter.nvml.events import EventStore, EventWatcher, GpuEvents, with_events
from exporter.nvml.mig import profile_from_attributes, profile_from_name
from exporter.nvml.sampler import NvmlSampler
from exporter.readings.device import (
    BUSY,
    MEMORY_TOTAL,
    MEMORY_USED,
    POWER,
    POWER_LIMIT,
    UTILIZATION,
)
from exporter.readings.events import LAST_XID, XID_FAMILY, xid_series
from exporter.readings.gpm import (
    DRAM_ACTIVE,
    DRAM_ACTIVE_SECONDS,
    NVLINK_TRANSMIT,
    SM_ACTIVE,
    SM_ACTIVE_SECONDS,
    TENSOR_ACTIVE,
    TENSOR_ACTIVE_SECONDS,
)
from exporter.readings.health import (
    ECC_AGGREGATE_CORRECTED,
    ECC_CORRECTED,
    PCIE_REPLAYS,
    REMAPPED_CORRECTABLE,
    REMAPPED_FAILED,
    REMAPPED_PENDING,
    REMAPPED_UNCORRECTABLE,
    RETIRED_DOUBLE_BIT,
    RETIRED_PENDING,
    RETIRED_SINGLE_BIT,
    THROTTLE,
    THROTTLE_FAMILY,
)
from exporter.readings.mig import MIG_MODE
from exporter.readings.pcie import PCIE_RECEIVE, PCIE_TRANSMIT
from exporter.sampling import SamplingLoop
from exporter.simulator import FleetError, SimulatedNvml
from exporter.simulator.fleet import parse_fleet
from tests.helpers import (
    ManualClock,
    assert_promtool_accepts,
    eventually,
    eventually_async,
    patient,
    running_daemon,
    series,
    value,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

MIG_LAYOUT = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]


def make(
    document: dict[str, object], *, events: bool = False, interval: float | None = None
) -> tuple[NvmlSampler, ManualClock, SimulatedNvml]:
    """A sampler on a manual clock; given an `interval`, it waits for answers as the daemon
    does (for the tests of late and stuck GPUs), else as long as a test may."""
    clock = ManualClock()
    driver = SimulatedNvml(parse_fleet(document), clock=clock, wall=lambda: 1.7e9 + clock())
    sampler = NvmlSampler(
        driver,
        clock=clock,
        events=EventWatcher(driver, wall=lambda: 1.7e9 + clock()) if events else None,
        interval=interval or 1.0,
    )
    if interval is None:
        patient(sampler)
    sampler.start()
    return sampler, clock, driver


@pytest.fixture
def closing() -> Iterator[list[NvmlSampler]]:
    """Samplers to close after the test (they may run helper threads)."""
    samplers: list[NvmlSampler] = []
    yield samplers
    for sampler in samplers:
        sampler.close()


def xids_of(gpu: GpuSample) -> dict[str, float]:
    """Times seen per XID, as the event thread counted them."""
    return {
        series.labels[0][1]: value
        for series, value in gpu.values.items()
        if series.family is XID_FAMILY
    }


def throttle_of(gpu: GpuSample) -> dict[str, float]:
    """Seconds throttled per reason, as the GPU gave them."""
    return {
        series.labels[0][1]: value
        for series, value in gpu.values.items()
        if series.family is THROTTLE_FAMILY
    }


def physical(gpus: tuple[GpuSample, ...]) -> dict[int, GpuSample]:
    return {g.identity.index: g for g in gpus if not g.identity.is_mig_instance}


def instances(gpus: tuple[GpuSample, ...]) -> dict[str, GpuSample]:
    return {g.identity.uuid: g for g in gpus if g.identity.is_mig_instance}


# -- GPM ------------------------------------------------------------------------------------


def test_gpm_activity_from_two_samples_and_integrated_counters() -> None:
    sampler, clock, _ = make(
        {
            "gpus": [{"model": "h100-sxm"}, {"model": "a100-sxm4-80gb"}],
            "processes": [
                {"pid": 1, "gpu": 0, "pattern": "steady", "level": 0.8, "tensor_intensity": 0.5},
                {"pid": 2, "gpu": 1, "pattern": "steady", "level": 0.8},
            ],
        }
    )
    clock.advance(1)
    first = physical(sampler.sample()[0])
    assert first[0].value(SM_ACTIVE) is None, "one sample is no window yet"
    assert first[0].value(SM_ACTIVE_SECONDS) is None
    total = 0.0
    for _ in range(10):
        clock.advance(0.5)
        hopper = physical(sampler.sample()[0])[0]
        sm_active = hopper.value(SM_ACTIVE)
        assert sm_active is not None
        total += sm_active * 0.5
        assert 0.6 < sm_active < 0.85
        assert hopper.value(TENSOR_ACTIVE) == pytest.approx(sm_active / 0.92 * 0.5)
        assert hopper.value(DRAM_ACTIVE) is not None
        assert (hopper.value(PCIE_RECEIVE) or 0) > 0
        assert hopper.value(NVLINK_TRANSMIT) is not None
    assert hopper.value(SM_ACTIVE_SECONDS) == pytest.approx(total)
    assert hopper.value(TENSOR_ACTIVE_SECONDS) is not None
    assert hopper.value(DRAM_ACTIVE_SECONDS) is not None
    ampere = physical(sampler.sample()[0])[1]
    assert ampere.value(SM_ACTIVE) is None, "no GPM before Hopper: absent, not 0"
    assert ampere.value(SM_ACTIVE_SECONDS) is None


def test_gpm_windows_shorter_than_100ms_wait_for_the_next_cycle() -> None:
    sampler, clock, _ = make({"gpus": [{"model": "h200-sxm"}], "processes": [{"pid": 1, "gpu": 0}]})
    sampler.sample()
    clock.advance(0.05)
    assert sampler.sample()[0][0].value(SM_ACTIVE) is None
    clock.advance(0.1)
    gpu = sampler.sample()[0][0]
    assert gpu.value(SM_ACTIVE) is not None
    assert gpu.value(SM_ACTIVE_SECONDS) == pytest.approx(gpu.value(SM_ACTIVE) * 0.15)


# -- MIG ------------------------------------------------------------------------------------


def mig_fleet() -> dict[str, object]:
    return {
        "gpus": [{"model": "h100-sxm", "mig": MIG_LAYOUT}, {"model": "h100-sxm"}],
        "processes": [
            {"pid": 10, "gpu": 0, "mig_instance": 0, "memory": "30GiB", "level": 0.9},
            {"pid": 11, "gpu": 0, "mig_instance": 2, "memory": "5GiB", "level": 0.5},
            {"pid": 12, "gpu": 0, "mig_instance": 3, "memory": "2GiB", "pattern": "idle"},
            {"pid": 20, "gpu": 1, "memory": "10GiB"},
        ],
        "faults": [{"kind": "mig_layout", "gpu": 0, "at": "10s", "mig": ["3g.40gb", "4g.40gb"]}],
    }


def test_each_mig_instance_is_a_gpu_with_its_memory_processes_and_gpm() -> None:
    sampler, clock, _ = make(mig_fleet())
    clock.advance(1)
    sampler.sample()
    clock.advance(1)
    gpus, statuses = sampler.sample()
    assert all(status.success for status in statuses)
    parent = physical(gpus)[0]
    assert parent.value(MIG_MODE) == 1
    assert physical(gpus)[1].value(MIG_MODE) == 0
    assert parent.value(UTILIZATION) is None, "NVML reports no utilization in MIG mode: not faked"
    assert parent.value(BUSY) is None
    assert parent.processes is None, "processes are listed per instance"
    assert parent.value(POWER) is not None
    assert parent.value(SM_ACTIVE) is not None, "GPM of the whole GPU"
    found = sorted(instances(gpus).values(), key=lambda g: g.identity.gpu_instance or 0)
    assert [g.identity.mig_profile for g in found] == MIG_LAYOUT
    assert [g.identity.gpu_instance for g in found] == [1, 2, 3, 4]
    big = found[0]
    assert big.identity.index == 0
    assert big.identity.uuid.startswith("MIG-")
    assert big.identity.parent_uuid == parent.identity.uuid
    assert big.identity.model == parent.identity.model
    assert big.value(MEMORY_USED) == 30 * 2**30
    assert big.value(MEMORY_TOTAL) == 39.5 * 2**30
    assert big.processes is not None
    assert [(p.pid, p.sm_utilization) for p in big.processes] == [(10, None)]
    assert big.value(UTILIZATION) is None
    assert big.value(SM_ACTIVE) is not None
    assert big.value(SM_ACTIVE) > found[2].value(SM_ACTIVE)  # type: ignore[operator]
    assert big.value(PCIE_TRANSMIT) is None, "PCIe belongs to the GPU"
    assert found[1].processes == ()
    # order: each physical GPU followed by its instances
    assert [(g.identity.index, g.identity.gpu_instance) for g in gpus] == [
        (0, None),
        (0, 1),
        (0, 2),
        (0, 3),
        (0, 4),
        (1, None),
    ]


def test_mig_instances_appear_and_vanish_when_the_layout_changes() -> None:
    sampler, clock, _ = make(mig_fleet())
    clock.advance(1)
    before = instances(sampler.sample()[0])
    clock.now = 11
    after = instances(sampler.sample()[0])
    assert len(before) == 4
    assert len(after) == 2
    kept = set(before) & set(after)
    assert len(kept) == 1, "the 3g.40gb instance in the same place stays"
    assert before[next(iter(kept))].identity.mig_profile == "3g.40gb"
    (new,) = set(after) - set(before)
    assert after[new].identity.mig_profile == "4g.40gb"
    assert after[new].processes == (), "the processes of destroyed instances stopped"


def test_mig_profile_names() -> None:
    assert profile_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "1g.5gb"
    assert profile_from_name("NVIDIA H100 80GB HBM3 MIG 3g.40gb") == "3g.40gb"
    assert profile_from_name("NVIDIA H100 80GB HBM3") is None
    # From slices and memory: the catalog's nearest profile, or NVIDIA's naming pattern.
    assert profile_from_attributes("NVIDIA H100 80GB HBM3", 1, 9984) == "1g.10gb"
    assert profile_from_attributes("NVIDIA H100 80GB HBM3", 1, 20096) == "1g.20gb"
    assert profile_from_attributes("NVIDIA H100 NVL", 3, 47616) == "3g.47gb"
    assert profile_from_attributes("NVIDIA Unknown GPU", 2, 24576) == "2g.24gb"


# -- throttle time and memory health --------------------------------------------------------


def test_throttle_time_accumulates_under_sustained_load() -> None:
    sampler, clock, _ = make(
        {
            "gpus": [{"model": "h100-sxm", "cooling": "poor"}, {"model": "l4"}],
            "processes": [{"pid": 1, "gpu": 0, "level": 1.0, "memory_intensity": 1.0}],
        }
    )
    for _ in range(300):
        clock.advance(1)
        gpus = physical(sampler.sample()[0])
    hot = throttle_of(gpus[0])
    idle = throttle_of(gpus[1])
    assert set(hot) == {
        "power",
        "thermal",
        "sync_boost",
        "board_limit",
        "low_utilization",
        "reliability",
        "app_clocks",
        "base_clocks",
    }
    assert hot["thermal"] > 30, "a poorly cooled GPU under load spends time thermally throttled"
    assert hot["power"] > 100, "and at its power cap"
    assert hot["low_utilization"] == 0
    assert hot["app_clocks"] >= max(hot["power"], hot["thermal"])
    # read on the health clock: last at t = 296 s, 295 s after the first reading
    assert idle["low_utilization"] == pytest.approx(296, abs=1)
    assert idle["thermal"] == 0


def test_health_is_read_on_its_own_slower_clock() -> None:
    sampler, clock, _ = make({"gpus": [{"model": "l4"}]})
    readings = []
    for _ in range(12):
        clock.advance(1)
        (gpu,) = sampler.sample()[0]
        readings.append(throttle_of(gpu)["low_utilization"])
    # first read at 1 s, then every HEALTH_PERIOD_SECONDS (5 s): the last reading in between
    assert readings == [1.0] * 5 + [6.0] * 5 + [11.0] * 2


@pytest.mark.timeout(10)
def test_counts_and_the_power_limit_are_read_on_the_health_clock_and_shown_every_cycle() -> None:
    sampler, clock, driver = make(
        {
            "gpus": [{"model": "a100-sxm4-80gb"}],
            "faults": [{"kind": "ecc", "gpu": 0, "at": "2s", "corrected": 4}],
        }
    )
    asked: list[float] = []
    replays = driver.nvmlDeviceGetPcieReplayCounter

    def counted(handle: object) -> int:
        asked.append(clock())
        return int(replays(handle))

    driver.nvmlDeviceGetPcieReplayCounter = counted  # type: ignore[method-assign]
    shown = []
    for _ in range(12):
        clock.advance(1)
        (gpu,) = sampler.sample()[0]
        shown.append((gpu.value(ECC_CORRECTED), gpu.value(PCIE_REPLAYS), gpu.value(POWER_LIMIT)))
    assert asked == [1.0, 6.0, 11.0]
    # Without an event thread, an ECC count shows at the next reading on the health clock
    # (with one, at the event: test_ecc_event_refreshes_the_ecc_counters_between_cycles).
    assert shown == [(0, 0, 400.0)] * 5 + [(4, 0, 400.0)] * 7


@pytest.mark.timeout(10)
def test_a_slow_clock_reading_refused_mid_run_drops_alone_from_the_repeated_values() -> None:
    sampler, clock, _ = make(
        {
            "gpus": [{"model": "a100-sxm4-80gb"}],
            "faults": [
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetRemappedRows",
                    "at": "5s",
                    "error": "not_supported",
                }
            ],
        }
    )
    shown = []
    for _ in range(12):
        clock.advance(1)
        (gpu,) = sampler.sample()[0]
        shown.append((gpu.value(REMAPPED_PENDING), gpu.value(ECC_AGGREGATE_CORRECTED)))
    # Read at 1 s and repeated between; refused at 6 s (its next reading), gone from then on,
    # while the collector's other readings on the clock keep being repeated.
    assert shown == [(0, 0)] * 5 + [(None, 0)] * 7


def test_field_values_stand_in_for_the_deprecated_violation_status_and_vice_versa() -> None:
    sampler, clock, driver = make(
        {
            "gpus": [{"model": "l4", "count": 3}],
            "faults": [
                {"kind": "error", "gpu": 0, "function": "nvmlDeviceGetFieldValues"},
                {
                    "kind": "error",
                    "gpu": 1,
                    "function": "nvmlDeviceGetViolationStatus",
                    "error": "function_not_found",
                },
            ],
        }
    )
    all_fields = driver.nvmlDeviceGetFieldValues

    def without_app_clocks_field(handle: Any, field_ids: list[int]) -> Any:
        values = all_fields(handle, field_ids)
        for field in values:  # a driver that no longer fills the deprecated total
            if field.fieldId == pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS:
                field.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    driver.nvmlDeviceGetFieldValues = without_app_clocks_field  # type: ignore[method-assign]
    clock.advance(3)
    gpus = physical(sampler.sample()[0])
    for gpu in (0, 2):  # no field values at all / one field missing: the violation status
        throttle = throttle_of(gpus[gpu])
        assert len(throttle) == 8
        assert throttle["low_utilization"] == pytest.approx(3)
        assert throttle["app_clocks"] == pytest.approx(3)
    # Without the violation status, a reason whose field is missing is absent, not 0.
    throttle = throttle_of(gpus[1])
    assert "app_clocks" not in throttle
    assert throttle["low_utilization"] == pytest.approx(3)


def test_remapped_rows_and_retired_pages_where_supported() -> None:
    sampler, clock, _ = make(
        {
            "gpus": [
                {"model": "a100-sxm4-80gb"},
                {"model": "v100-sxm2-32gb"},
                {"model": "l4"},
                {"model": "h100-sxm", "mig": ["7g.80gb"]},
            ],
            "faults": [
                {"kind": "ecc", "gpu": 0, "at": "2s", "uncorrected": 2},
                {"kind": "ecc", "gpu": 1, "at": "2s", "corrected": 4, "uncorrected": 1},
            ],
        }
    )
    clock.advance(1)
    before = physical(sampler.sample()[0])
    clock.advance(5)  # the next reading on the health clock
    after = physical(sampler.sample()[0])
    rows = (REMAPPED_CORRECTABLE, REMAPPED_UNCORRECTABLE, REMAPPED_PENDING, REMAPPED_FAILED)
    pages = (RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT, RETIRED_PENDING)
    assert [before[0].value(series) for series in rows] == [0, 0, 0, 0]
    assert (after[0].value(REMAPPED_UNCORRECTABLE), after[0].value(REMAPPED_PENDING)) == (2, 1)
    assert after[0].value(RETIRED_SINGLE_BIT) is None, "A100 remaps rows instead of retiring pages"
    assert [after[1].value(series) for series in pages] == [2, 1, 1]
    assert after[1].value(REMAPPED_CORRECTABLE) is None
    assert after[2].value(REMAPPED_CORRECTABLE) is None, "GDDR: neither"
    assert after[2].value(RETIRED_SINGLE_BIT) is None
    assert after[3].value(REMAPPED_CORRECTABLE) is None, "not with MIG on"


# -- events ---------------------------------------------------------------------------------


def xid_fleet() -> dict[str, object]:
    return {
        "gpus": [{"count": 2}],
        "faults": [
            {"kind": "xid", "gpu": 0, "at": "1s", "xid": 79},
            {"kind": "xid", "gpu": 0, "at": "2s", "xid": 79},
            {"kind": "xid", "gpu": 1, "at": "2s", "xid": 13},
            {"kind": "ecc", "gpu": 1, "at": "3s", "corrected": 5},
        ],
    }


def test_an_xid_raised_twice_counts_two(closing: list[NvmlSampler]) -> None:
    sampler, clock, _ = make(xid_fleet(), events=True)
    closing.append(sampler)
    assert xids_of(physical(sampler.sample()[0])[0]) == {}
    clock.now = 2.5

    def counts() -> dict[int, dict[str, float]]:
        return {i: xids_of(g) for i, g in physical(sampler.sample()[0]).items()}

    eventually(
        lambda: counts() == {0: {"79": 2}, 1: {"13": 1}},
        10,
        "two XID 79 and one XID 13",
        every=0.01,
    )
    gpu = physical(sampler.sample()[0])[0]
    assert gpu.value(LAST_XID) == pytest.approx(1.7e9 + 2.5)


def test_ecc_event_refreshes_the_ecc_counters_between_cycles(closing: list[NvmlSampler]) -> None:
    sampler, clock, _ = make(xid_fleet(), events=True)
    closing.append(sampler)
    stale = physical(sampler.sample()[0])[1]
    assert stale.value(ECC_CORRECTED) == 0
    clock.now = 3
    # Without a new cycle, the store already holds the totals the event thread read.
    watcher = sampler._events
    assert watcher is not None
    eventually(
        lambda: (watcher.store.get(stale.identity.uuid) or GpuEvents()).ecc_corrected == 5,
        10,
        "the ECC totals read after the event",
        every=0.01,
    )
    (fresh,) = sampler.overlay_events((stale,))
    assert fresh.value(ECC_CORRECTED) == 5


def test_with_events_keeps_xids_of_a_down_gpu_and_never_lowers_a_counter() -> None:
    sampler, _, _ = make({"gpus": [{}]})
    (up,) = sampler.sample()[0]
    events = GpuEvents(xid_counts=((79, 1),), last_xid_timestamp=5.0, ecc_corrected=2)
    merged = with_events(up, events)
    assert xids_of(merged) == {"79": 1}
    assert merged.value(ECC_CORRECTED) == 2
    ahead = replace(up, values={**up.values, ECC_CORRECTED: 9})
    assert with_events(ahead, events).value(ECC_CORRECTED) == 9
    down = with_events(replace(up, up=False, values={}), events)
    assert xids_of(down) == {"79": 1}
    assert down.value(ECC_CORRECTED) is None
    assert with_events(up, None) is up


def test_the_event_thread_outlives_failing_waits_and_detaches_in_bounded_time() -> None:
    clock = ManualClock()
    driver = SimulatedNvml(parse_fleet(xid_fleet()), clock=clock)
    failures = iter([pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)] * 3)
    real_wait = driver.nvmlEventSetWait_v2

    def flaky_wait(event_set: object, timeout_ms: int) -> object:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_wait(event_set, timeout_ms)

    driver.nvmlEventSetWait_v2 = flaky_wait  # type: ignore[method-assign]
    driver.nvmlInit()
    watcher = EventWatcher(driver, wait_ms=50)
    watcher.start()
    handles = [driver.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    assert watcher.attach([("GPU-a", handles[0]), ("GPU-b", handles[1])]) == 2
    clock.now = 2
    eventually(
        lambda: watcher.store.get("GPU-a") is not None,
        10,
        "an XID after three failed waits",
        every=0.01,
    )
    started = time.monotonic()
    watcher.detach()
    assert time.monotonic() - started < 5, "detach waits for one wait at most"
    # Re-attached (as after a re-init): only events from then on.
    watcher.attach([("GPU-a", handles[0])])
    watcher.close()
    events = watcher.store.get("GPU-a")
    assert events is not None
    assert events.xid_counts[0][0] == 79


def test_gpus_that_cannot_register_are_skipped() -> None:
    driver = SimulatedNvml(
        parse_fleet(
            {
                "gpus": [{"count": 2}],
                "faults": [
                    {
                        "kind": "error",
                        "gpu": 1,
                        "function": "nvmlDeviceRegisterEvents",
                        "error": "not_supported",
                    }
                ],
            }
        )
    )
    driver.nvmlInit()
    watcher = EventWatcher(driver, wait_ms=20)
    handles = [driver.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    assert watcher.attach([("a", handles[0]), ("b", handles[1])]) == 1
    watcher.close()


async def test_an_event_is_published_before_the_next_cycle() -> None:
    driver = SimulatedNvml(
        parse_fleet({"gpus": [{}], "faults": [{"kind": "xid", "gpu": 0, "at": "300ms", "xid": 94}]})
    )
    sampling = SamplingLoop(
        replace(ServeConfig(), collect_interval=600.0), driver, build=BuildInfo("test")
    )
    await sampling.start()
    task = asyncio.create_task(sampling.run())

    def with_the_xid() -> str | None:
        exposition = sampling.exposition
        if exposition is None:
            return None
        text = exposition.render(TEXT).body.decode()
        return text if series(text, "gpu_xid_errors_total") else None

    try:
        text = await eventually_async(with_the_xid, 5, "the XID to reach /metrics")
        assert value(text, "gpu_xid_errors_total", xid="94") == 1
        assert value(text, "gpuscope_sample_cycles_total") == 1, "no new cycle was needed"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sampling.close()


def test_event_store_is_thread_safe_and_counts_per_xid() -> None:
    store = EventStore()
    changes = []
    store.on_change = lambda: changes.append(1)

    def record() -> None:
        for _ in range(500):
            store.record_xid("GPU-x", 48, 1.0)

    threads = [threading.Thread(target=record) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = store.get("GPU-x")
    assert events is not None
    assert events.xid_counts == ((48, 2000),)
    assert len(changes) == 2000


# -- PCIe throughput, read by each GPU's worker after its answer --------------------------------


def test_a_pcie_read_stuck_in_the_driver_costs_only_its_gpu(closing: list[NvmlSampler]) -> None:
    sampler, clock, driver = make(
        {"gpus": [{"model": "a100-sxm4-80gb", "count": 4}], "processes": [{"pid": 1, "gpu": 0}]},
        interval=0.1,
    )
    closing.append(sampler)
    sampler.hang_seconds = 1.0
    release = threading.Event()
    reading = threading.Event()
    real_read = driver.nvmlDeviceGetPcieThroughput

    def stuck_read(handle: Any, counter: int) -> int:
        if handle.device.gpu.index == 0:
            reading.set()
            release.wait(30)  # a read that does not return until the test says so
        return real_read(handle, counter)

    driver.nvmlDeviceGetPcieThroughput = stuck_read  # type: ignore[method-assign]
    try:
        sampler.sample()
        assert reading.wait(10), "GPU 0's worker started reading PCIe"
        # GPU 0's worker is blocked inside the driver; the cycle waits for it at most
        # wait_seconds, the other GPUs answer every cycle, GPU 0 keeps its last answer, then is
        # down (hung) once its call has been out for hang_seconds.
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            clock.advance(0.1)
            before = time.monotonic()
            gpus, (status, *_) = sampler.sample()
            assert time.monotonic() - before < sampler.wait_seconds + 0.5
            assert status.success
            assert all(physical(gpus)[i].up for i in (1, 2, 3))
        assert physical(gpus)[0].down_reason == "hung"
        assert not physical(gpus)[0].up
    finally:
        release.set()
    eventually(
        lambda: physical(sampler.sample()[0])[0].up,
        10,
        "GPU 0 back once the read returns",
        every=0.01,
    )
    eventually(
        lambda: physical(sampler.sample()[0])[1].value(PCIE_RECEIVE) is not None,
        10,
        "PCIe figures",
        every=0.01,
    )


def test_pcie_figures_go_stale_rather_than_linger(closing: list[NvmlSampler]) -> None:
    sampler, clock, driver = make({"gpus": [{"model": "l4"}]})
    closing.append(sampler)
    sampler.sample()
    eventually(
        lambda: physical(sampler.sample()[0])[0].value(PCIE_TRANSMIT) is not None,
        10,
        "a first figure",
        every=0.01,
    )

    failed: list[int] = []

    def failing(handle: object, counter: int) -> int:
        failed.append(counter)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    def read_through_the_failing_driver() -> bool:
        if not failed:
            sampler.sample()  # a job, should the worker have been busy when the last was offered
        return bool(failed)

    driver.nvmlDeviceGetPcieThroughput = failing  # type: ignore[method-assign]
    sampler.sample()
    # The worker reads PCIe after each job, one at a time: once a read went to the failing
    # driver, any read still in its 20 ms window when the driver was swapped has finished.
    eventually(read_through_the_failing_driver, 10, "a PCIe read that fails", every=0.01)
    clock.advance(10)
    sampler.sample()
    assert physical(sampler.sample()[0])[0].value(PCIE_TRANSMIT) is None


# -- fleet keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"gpus": [{"model": "l4", "mig": ["1g.10gb"]}]}, "has no MIG mode"),
        ({"gpus": [{"mig": ["5g.50gb"]}]}, "'5g.50gb' is not a MIG profile"),
        ({"gpus": [{"mig": ["4g.40gb", "4g.40gb"]}]}, "at most 1 4g.40gb"),
        ({"gpus": [{"mig": ["3g.40gb", "3g.40gb", "1g.10gb"]}]}, "do not fit one GPU"),
        ({"gpus": [{"mig": "3g.40gb"}]}, "expected a list"),
        (
            {"gpus": [{"mig": ["7g.80gb"]}], "processes": [{"pid": 1, "gpu": 0}]},
            "give the process a mig_instance",
        ),
        ({"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "mig_instance": 0}]}, "not in MIG mode"),
        (
            {
                "gpus": [{"mig": ["7g.80gb"]}],
                "processes": [{"pid": 1, "gpu": 0, "mig_instance": 1}],
            },
            "1 is not an instance of GPU 0",
        ),
        (
            {
                "gpus": [{"mig": ["1g.10gb"]}],
                "processes": [{"pid": 1, "gpu": 0, "mig_instance": 0, "memory": "12GiB"}],
            },
            "does not fit a 1g.10gb instance",
        ),
        (
            {"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "mig_instance": -1}]},
            "not an instance position",
        ),
        ({"gpus": [{}], "faults": [{"kind": "xid", "gpu": 0}]}, "xid: an XID number"),
        ({"gpus": [{}], "faults": [{"kind": "xid", "xid": 79}]}, "gpu: missing"),
        (
            {"gpus": [{}], "faults": [{"kind": "gpu_lost", "gpu": 0, "xid": 79}]},
            "only faults of kind xid",
        ),
        (
            {"gpus": [{}], "faults": [{"kind": "mig_layout", "gpu": 0, "mig": []}]},
            "not in MIG mode",
        ),
        (
            {
                "gpus": [{"mig": []}],
                "faults": [{"kind": "mig_layout", "gpu": 0, "mig": ["9g.1gb"]}],
            },
            "not a MIG profile",
        ),
        (
            {"gpus": [{}], "faults": [{"kind": "ecc", "gpu": 0, "mig": []}]},
            "only faults of kind mig_layout",
        ),
        (
            {"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "tensor_intensity": 2}]},
            "tensor_intensity",
        ),
    ],
)
def test_bad_deeper_fleets_say_what_is_wrong(document: dict[str, object], problem: str) -> None:
    with pytest.raises(FleetError, match=problem.replace("(", r"\(")):
        parse_fleet(document)


def test_simulated_gpm_mig_and_event_functions_behave_like_nvml() -> None:
    clock = ManualClock()
    nvml = SimulatedNvml(parse_fleet(mig_fleet()), clock=clock, wall=lambda: 1.7e9 + clock())
    nvml.nvmlInit()
    parent, plain = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert nvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(plain, 0)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    assert nvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert nvml.nvmlDeviceGetAttributes_v2(mig).gpuInstanceSliceCount == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(mig)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceId(plain)
    processes = nvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert {(p.pid, p.gpuInstanceId) for p in processes} == {(10, 1), (11, 3), (12, 4)}
    clock.now = 11
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetUUID(mig)  # destroyed by the layout change

    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmMigSampleGet(parent, 1, first)
    clock.advance(1)
    nvml.nvmlGpmSampleGet(parent, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    request.sample1, request.sample2 = first, second
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmMetricsGet(request)  # samples of different targets
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmMigSampleGet(parent, 9, first)
    nvml.nvmlGpmSampleFree(first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmSampleFree(first)

    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(plain, pynvml.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(events, 30)
    nvml.nvmlEventSetFree(events)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait_v2(events, 30)


def test_simulated_gpus_before_hopper_have_no_gpm() -> None:
    nvml = SimulatedNvml(parse_fleet({"gpus": [{"model": "l4"}]}))
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlGpmSampleGet(handle, nvml.nvmlGpmSampleAlloc())


# -- families (pure) ------------------------------------------------------------------------


def deeper_families(*gpus: GpuSample) -> dict[str, list[tuple[dict[str, str], float]]]:
    snapshot = Snapshot(timestamp=1.0, gpus=gpus, collectors=())
    return {
        family.name: [(dict(s.labels), s.value) for s in family.samples]
        for family in snapshot_families(snapshot, BuildInfo("1", "3.11"))
    }


PARENT = GpuIdentity(1, "GPU-p", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", "570", "12.8")
INSTANCE = replace(PARENT, uuid="MIG-i", mig_profile="3g.40gb", gpu_instance=2, parent_uuid="GPU-p")


def test_mig_instance_series_carry_profile_and_instance_and_info_the_parent() -> None:
    found = deeper_families(
        GpuSample(PARENT, up=True, values={MIG_MODE: 1, POWER: 300.0}),
        GpuSample(
            INSTANCE,
            up=True,
            values={MEMORY_USED: 2**30, SM_ACTIVE: 0.5, SM_ACTIVE_SECONDS: 3.0},
            processes=(ProcessSample(7, 2**30, None, None),),
        ),
    )
    mig = {"gpu": "1", "uuid": "MIG-i", "model": PARENT.model}
    mig_labels = {**mig, "mig_profile": "3g.40gb", "gpu_instance": "2"}
    assert (mig_labels, 1) in found["gpu_up"]
    assert ({"gpu": "1", "uuid": "GPU-p", "model": PARENT.model}, 1) in found["gpu_up"]
    info = [labels for labels, _ in found["gpu_info"] if labels["uuid"] == "MIG-i"]
    assert info == [
        {
            **mig_labels,
            "parent_uuid": "GPU-p",
            "pci_bus_id": PARENT.pci_bus_id,
            "driver_version": "570",
            "cuda_version": "12.8",
        }
    ]
    assert found["gpu_memory_used_bytes"] == [(mig_labels, 2**30)]
    assert found["gpu_process_memory_used_bytes"] == [({**mig_labels, "pid": "7"}, 2**30)]
    assert found["gpu_sm_active_ratio"] == [(mig_labels, 0.5)]
    assert found["gpu_sm_active_seconds"] == [(mig_labels, 3.0)]
    assert found["gpu_mig_mode_enabled"] == [
        ({"gpu": "1", "uuid": "GPU-p", "model": PARENT.model}, 1)
    ]
    assert found["gpu_power_watts"][0][0] == {"gpu": "1", "uuid": "GPU-p", "model": PARENT.model}


def test_health_series() -> None:
    found = deeper_families(
        GpuSample(
            PARENT,
            up=True,
            values={
                THROTTLE["power"]: 1.5,
                THROTTLE["thermal"]: 0.0,
                REMAPPED_CORRECTABLE: 1,
                REMAPPED_UNCORRECTABLE: 2,
                REMAPPED_PENDING: 1,
                REMAPPED_FAILED: 0,
                RETIRED_SINGLE_BIT: 3,
                RETIRED_DOUBLE_BIT: 0,
                xid_series(48): 1,
                xid_series(79): 2,
                LAST_XID: 1234.5,
            },
        )
    )
    labels = {"gpu": "1", "uuid": "GPU-p", "model": PARENT.model}
    assert found["gpu_throttle_seconds"] == [
        ({**labels, "reason": "power"}, 1.5),
        ({**labels, "reason": "thermal"}, 0.0),
    ]
    assert found["gpu_remapped_rows"] == [
        ({**labels, "cause": "correctable"}, 1),
        ({**labels, "cause": "uncorrectable"}, 2),
    ]
    assert found["gpu_remapped_rows_pending"] == [(labels, 1)]
    assert found["gpu_remapped_rows_failed"] == [(labels, 0)]
    assert found["gpu_retired_pages"] == [
        ({**labels, "cause": "single_bit"}, 3),
        ({**labels, "cause": "double_bit"}, 0),
    ]
    assert found["gpu_retired_pages_pending"] == [], "unknown pending status: absent"
    assert found["gpu_xid_errors"] == [
        ({**labels, "xid": "48"}, 1),
        ({**labels, "xid": "79"}, 2),
    ]
    assert found["gpu_last_xid_timestamp_seconds"] == [(labels, 1234.5)]


def test_a_down_gpu_keeps_its_xid_counters_and_nothing_else_new() -> None:
    found = deeper_families(
        GpuSample(
            PARENT,
            up=False,
            values={
                xid_series(79): 1,
                LAST_XID: 9.0,
                THROTTLE["power"]: 1.0,
                SM_ACTIVE: 0.4,
            },
        )
    )
    assert [v for _, v in found["gpu_xid_errors"]] == [1]
    assert [v for _, v in found["gpu_last_xid_timestamp_seconds"]] == [9.0]
    assert found["gpu_throttle_seconds"] == []
    assert found["gpu_sm_active_ratio"] == []


# -- end to end: the daemon on a simulated fleet --------------------------------------------

E2E_FLEET = """
seed: 5
gpus:
  - {model: h100-sxm}
  - {model: h100-sxm, mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]}
  - {model: a100-sxm4-80gb}
processes:
  - {pid: 1, gpu: 0, memory: 10GiB, level: 0.9}
  - {pid: 2, gpu: 1, mig_instance: 0, memory: 10GiB, level: 0.7}
  - {pid: 3, gpu: 2, memory: 10GiB, pattern: input_starved, level: 0.9, duty: 0.5}
faults:
  - {kind: xid, gpu: 0, at: 2s, xid: 79}
  - {kind: xid, gpu: 0, at: 2300ms, xid: 79}
  - {kind: mig_layout, gpu: 1, at: 4s, mig: [7g.80gb]}
"""


@pytest.mark.slow
def test_the_daemon_serves_the_deeper_signals_end_to_end(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(E2E_FLEET)
    with running_daemon(f"--simulate={fleet}", "--collect.interval=100ms") as daemon:
        daemon.wait_ready()
        eventually(
            lambda: (
                series(daemon.metrics(), "gpu_xid_errors_total", xid="79")
                and value(daemon.metrics(), "gpu_xid_errors_total", xid="79") == 2
            ),
            10,
            "XID 79 twice",
        )
        before = daemon.metrics()
        eventually(
            lambda: (
                {
                    dict(labels)["mig_profile"]
                    for labels in series(daemon.metrics(), "gpu_up", gpu="1")
                    if "mig_profile" in dict(labels)
                }
                == {"7g.80gb"}
            ),
            10,
            "the new MIG layout",
        )
        eventually(
            lambda: series(daemon.metrics(), "gpu_pcie_receive_bytes_per_second", gpu="2"),
            10,
            "the PCIe thread's figures",
        )
        after = daemon.metrics()
    assert len(series(before, "gpu_up", gpu="1")) == 5, "the GPU and its four instances"
    assert len(series(after, "gpu_up", gpu="1")) == 2, "the GPU and its one instance"
    assert value(after, "gpu_xid_errors_total", gpu="0", xid="79") == 2
    assert value(after, "gpu_mig_mode_enabled", gpu="1") == 1
    assert value(after, "gpu_pcie_receive_bytes_per_second", gpu="2") > 0
    assert series(after, "gpu_throttle_seconds_total", gpu="2", reason="power")
    assert_promtool_accepts(after)


def test_a_driver_without_mig_device_handles_reports_the_gpu_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    document = mig_fleet()
    document["faults"] = [
        {
            "kind": "error",
            "function": "nvmlDeviceGetMigDeviceHandleByIndex",
            "error": "function_not_found",
        }
    ]
    sampler, clock, driver = make(document)
    calls = 0
    real = driver.nvmlDeviceGetMigDeviceHandleByIndex

    def counted(handle: object, index: int) -> object:
        nonlocal calls
        calls += 1
        return real(handle, index)

    driver.nvmlDeviceGetMigDeviceHandleByIndex = counted  # type: ignore[method-assign]
    caplog.set_level("INFO")
    for _ in range(3):
        clock.advance(1)
        gpus, (status, *_) = sampler.sample()
    assert status.success
    assert instances(gpus) == {}
    assert physical(gpus)[0].up
    assert physical(gpus)[0].value(MIG_MODE) == 1
    assert calls == 1, "not asked again until NVML re-initialises"
    assert len([r for r in caplog.records if getattr(r, "reading", None) == "mig_devices"]) == 1
