"""`gpuscope calibrate` on the CPU with the real PyTorch: the method, the plan, the device, the
progress, and a quick run that gives a valid profile with plausible figures."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import TYPE_CHECKING

import pytest
from rich.console import Console

from exporter.calibrate.method import MethodSettings, iteration_times, summarize
from exporter.calibrate.progress import BarReporter, LogReporter, reporter_for
from exporter.calibration.parse import parse_profile_text
from exporter.calibration.profile import Figure, Skipped, dump_profile
from exporter.catalog import DTYPES, builtin_catalog
from exporter.simulator import SimulatedNvml, load_fleet
from tests.helpers import FLEETS, ManualClock
from tests.profiles import pytorch_missing

try:
    import torch

    from exporter.calibrate import kernels
    from exporter.calibrate.device import (
        NvmlConditions,
        cpu_model_name,
        describe,
        largest_cpu_cache_bytes,
        parse_cache_size,
        resolve,
    )
    from exporter.calibrate.run import (
        GIB,
        MIB,
        best,
        describe_result,
        format_quantity,
        measure,
        plan_for,
        run_calibration,
    )
except ImportError as missing:
    pytorch_missing(missing)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from exporter.calibration.profile import Profile

CPU_QUICK = MethodSettings(warmup_seconds=0.01, trial_seconds=0.005, trials=3)


class FakeTimer:
    """Each iteration takes `per_iteration` seconds, plus the given extra per batch."""

    name = "fake"

    def __init__(self, per_iteration: float, extras: list[float] | None = None) -> None:
        self.per_iteration = per_iteration
        self.extras = list(extras or [])
        self.batches: list[int] = []

    def seconds(self, work: Callable[[], object], iterations: int) -> float:
        self.batches.append(iterations)
        return iterations * self.per_iteration + (self.extras.pop(0) if self.extras else 0.0)


def test_summary_median_spread_and_stability() -> None:
    summary = summarize([10.0, 11.0, 9.0, 10.5, 10.0])
    assert (summary.median, summary.minimum, summary.maximum, summary.trials) == (10, 9, 11, 5)
    assert summary.spread == pytest.approx(0.2)
    assert summary.unstable(0.1)
    assert not summary.unstable(0.25)
    with pytest.raises(ValueError, match="no trials"):
        summarize([])


def test_method_warms_up_then_sizes_trials_to_the_trial_time() -> None:
    timer = FakeTimer(per_iteration=0.001)
    settings = MethodSettings(warmup_seconds=0.02, trial_seconds=0.05, trials=4)
    times = iteration_times(lambda: None, timer, settings)
    warmup = timer.batches[:-4]
    assert warmup == [1, 2, 4, 8, 16]  # doubling until 31 ms >= 20 ms were spent
    assert timer.batches[-4:] == [50, 50, 50, 50]  # 50 x 1 ms = the 50 ms trial
    assert times == [pytest.approx(0.001)] * 4


def test_a_slow_operation_still_gets_one_iteration_per_trial() -> None:
    timer = FakeTimer(per_iteration=2.0)
    times = iteration_times(lambda: None, timer, MethodSettings(0.5, 0.1, trials=2))
    assert timer.batches == [1, 1, 1]
    assert times == [2.0, 2.0]


def test_measure_turns_trials_into_a_figure_and_refusals_into_reasons() -> None:
    @contextlib.contextmanager
    def fake(kind: str) -> Iterator[kernels.Workload]:
        yield kernels.Workload(lambda: None, 1000.0, kind, "tiny")  # type: ignore[arg-type]

    timer = FakeTimer(0.001, extras=[0.0, 0.0, 0.0005])  # warm-up, trial 1, trial 2 slow
    rate = measure(
        lambda: fake("rate"), timer, MethodSettings(0.001, 0.001, 3), unit="B/s", datasheet=2e6
    )
    assert isinstance(rate, Figure)
    assert rate.value == pytest.approx(1e6)
    assert rate.minimum == pytest.approx(1000 / 0.0015)
    assert rate.unstable
    assert rate.achieved_ratio == pytest.approx(0.5)
    latency = measure(lambda: fake("latency"), FakeTimer(0.001), CPU_QUICK, unit="s")
    assert isinstance(latency, Figure)
    assert latency.value == pytest.approx(1e-6)

    @contextlib.contextmanager
    def refused() -> Iterator[kernels.Workload]:
        raise kernels.Unsupported("not on this device")
        yield  # pragma: no cover - a generator that refuses before yielding

    assert measure(refused, timer, CPU_QUICK, unit="s") == Skipped("not on this device")
    assert best([Skipped("a"), Skipped("b")]) == Skipped("a")
    assert best([Skipped("a"), rate, latency]) is rate


def test_plan_on_a_gpu_sizes_for_tensor_cores_and_far_above_l2() -> None:
    full = plan_for("cuda", quick=False, cache_bytes=50 * MIB, total_memory_bytes=80 * GIB)
    assert full.matmul_sizes["bf16"] == (4096, 8192, 16384)
    assert full.matmul_sizes["fp64"] == (2048, 4096)
    assert full.memory_bytes == GIB
    assert full.memory_bytes >= 16 * 50 * MIB
    assert full.transfer_bytes == GIB
    assert full.method.trials == 7
    quick = plan_for("cuda", quick=True, cache_bytes=96 * MIB, total_memory_bytes=24 * GIB)
    assert quick.matmul_sizes["fp8"] == (8192,)
    assert quick.memory_bytes == 8 * 96 * MIB
    assert quick.method.trials == 3
    small = plan_for("cuda", quick=False, cache_bytes=4 * MIB, total_memory_bytes=4 * GIB)
    assert small.matmul_sizes["fp32"] == (4096, 8192)  # 3 x 256 MiB fits in 1 GiB
    assert small.matmul_sizes["fp64"] == (2048, 4096)
    assert small.matmul_sizes["bf16"] == (4096, 8192)  # 3 x 512 MiB would not
    assert small.memory_bytes == 512 * MIB


def test_plan_on_a_cpu_is_small() -> None:
    quick = plan_for("cpu", quick=True, cache_bytes=32 * MIB, total_memory_bytes=16 * GIB)
    assert set(quick.matmul_sizes) == set(DTYPES)
    assert quick.matmul_sizes["fp32"] == (256,)
    assert quick.memory_bytes == 128 * MIB  # four times the last-level cache
    assert quick.transfer_bytes == 0
    full = plan_for("cpu", quick=False, cache_bytes=8 * MIB, total_memory_bytes=0)
    assert full.matmul_sizes["fp16"] == (256, 512)
    assert full.memory_bytes == 256 * MIB


def test_formatting() -> None:
    assert format_quantity(7.92e14, "FLOP/s") == "792 TFLOP/s"
    assert format_quantity(3.0e12, "B/s") == "3 TB/s"
    assert format_quantity(5.9e-6, "s") == "5.9 µs"
    assert format_quantity(2.5e-10, "s") == "0.25 ns"
    assert format_quantity(12.0, "OP/s") == "12 OP/s"
    figure = Figure(7.92e14, "FLOP/s", 7.8e14, 8.0e14, 7, False, "8192x8192x8192", 9.894e14)
    assert describe_result(figure) == "792 TFLOP/s ±1.3% at 8192x8192x8192 (80% of datasheet)"
    assert describe_result(Skipped("no fp8 here")) == "skipped: no fp8 here"


def test_cpu_facts_from_proc_and_sysfs(tmp_path: Path) -> None:
    assert cpu_model_name("processor\t: 0\nmodel name\t: AMD  EPYC 7B13\n") == "AMD EPYC 7B13"
    assert cpu_model_name("Hardware\t: BCM2835\n") == "BCM2835"
    assert cpu_model_name("") == "cpu"
    assert parse_cache_size("32768K\n") == 32 * MIB
    assert parse_cache_size("2M") == 2 * MIB
    assert parse_cache_size("lots") == 0
    for index, size in enumerate(["48K", "2048K", "32768K"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size)
    assert largest_cpu_cache_bytes(tmp_path) == 32 * MIB
    assert largest_cpu_cache_bytes(tmp_path / "missing") == 32 * MIB  # a safe guess


def test_nvml_conditions_through_the_daemons_driver_boundary() -> None:
    clock = ManualClock(30.0)
    driver = SimulatedNvml(load_fleet(FLEETS / "golden.yaml"), clock=clock, wall=clock)
    driver.nvmlInit()
    uuid = driver.nvmlDeviceGetUUID(driver.nvmlDeviceGetHandleByIndex(1))
    driver.nvmlShutdown()
    conditions = NvmlConditions(driver, uuid)
    assert conditions.open() is None
    reading = conditions.read()
    assert conditions.driver_version == "570.133.20"
    assert reading.temperature_celsius is not None
    assert reading.temperature_celsius > 25
    assert reading.sm_clock_hertz is not None
    assert reading.sm_clock_hertz > 1e8
    assert reading.power_watts is not None
    assert reading.power_watts > 0
    conditions.close()
    missing = NvmlConditions(driver, "GPU-not-here")
    assert missing.open() == "NVML has no GPU with UUID GPU-not-here"
    missing.close()


def test_progress_bars_on_a_terminal_and_log_lines_otherwise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    screen = io.StringIO()
    bars = BarReporter(Console(file=screen, force_terminal=True, width=100))
    bars.begin(2)
    bars.started("matmul bf16")
    bars.finished("matmul bf16", "792 TFLOP/s")
    bars.finished("memory copy", "3 TB/s")
    bars.close()
    shown = screen.getvalue()
    assert "matmul bf16" in shown
    assert "792 TFLOP/s" in shown
    assert "2/2" in shown
    assert isinstance(reporter_for(io.StringIO()), LogReporter)
    lines = LogReporter()
    with caplog.at_level(logging.INFO, logger="exporter.calibrate"):
        lines.begin(1)
        lines.started("launch latency")
        lines.finished("launch latency", "2.3 µs")
    assert [record.getMessage() for record in caplog.records] == ["calibration started", "measured"]
    assert caplog.records[1].step == "1/1"  # type: ignore[attr-defined]


def test_kernels_refuse_what_a_cpu_cannot_do() -> None:
    cpu = torch.device("cpu")
    for factory in (
        lambda: kernels.matmul("tf32", 64, cpu),
        lambda: kernels.transfer("host_to_device", 1024, cpu),
        lambda: kernels.graph_launch(cpu),
    ):
        with pytest.raises(kernels.Unsupported), factory():
            pass
    with kernels.matmul("int8", 64, cpu) as workload:
        assert workload.units == 2 * 64**3
        assert workload.work().dtype == torch.int32  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def quick_cpu_profile() -> Profile:
    info = describe(resolve("cpu"))
    return run_calibration(info, quick=True, catalog=builtin_catalog(), reporter=LogReporter())


def test_quick_cpu_calibration_gives_a_valid_profile(quick_cpu_profile: Profile) -> None:
    profile = quick_cpu_profile
    assert parse_profile_text(dump_profile(profile), source="run") == profile
    assert parse_profile_text(dump_profile(profile, "yaml"), source="run") == profile
    assert profile.device == "cpu"
    assert profile.quick
    assert profile.method.timer == "monotonic_clock"
    assert profile.software.torch == torch.__version__
    assert isinstance(profile.conditions, Skipped)
    assert profile.duration_seconds < 60


def test_quick_cpu_calibration_figures_are_plausible(quick_cpu_profile: Profile) -> None:
    profile = quick_cpu_profile
    for dtype in ("fp64", "fp32", "bf16", "fp16", "int8"):
        result = profile.matmul[dtype]
        assert isinstance(result, Figure), (dtype, result)
        assert 1e7 < result.value < 1e14, (dtype, result.value)  # 10 MFLOP/s .. 100 TFLOP/s
        assert result.minimum <= result.value <= result.maximum
        assert result.size == "256x256x256"
    assert isinstance(profile.matmul["tf32"], Skipped)
    assert "tensor-core" in profile.matmul["tf32"].reason
    assert profile.memory_bandwidth is not None
    assert 1e8 < profile.memory_bandwidth < 1e12  # 100 MB/s .. 1 TB/s
    copy = profile.memory_copy
    assert isinstance(copy, Figure)
    assert copy.size.endswith("MiB")
    assert int(copy.size.split()[0]) * MIB >= 64 * MIB
    assert isinstance(profile.host_to_device, Skipped)
    assert isinstance(profile.device_to_host, Skipped)
    latency = profile.launch_eager
    assert isinstance(latency, Figure)
    assert 1e-8 < latency.value < 1e-2  # 10 ns .. 10 ms per tiny op
    assert isinstance(profile.launch_cuda_graph, Skipped)
