"""The `simple` strategy on plain data: every classification, the "no answer"s and the settings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.catalog import builtin_catalog
from exporter.rightsize.hardware import Option, mig_compute_fraction
from exporter.rightsize.history import Ceilings, ContainerCpu
from exporter.rightsize.options import load
from exporter.rightsize.settings import StrategySettings, settings_text
from exporter.rightsize.strategy import (
    COMPUTE_BOUND,
    IDLE,
    INPUT_BOUND,
    MEMORY_BOUND,
    RIGHT_SIZED,
    STRATEGIES,
    UNDEFINED,
    UNDERUSED,
)
from exporter.settings import ConfigError
from tests.rightsize_data import (
    A100_40,
    A100_80,
    GIB,
    H100,
    L4,
    WINDOW,
    device,
    hardware,
    sample_workloads,
    settings,
    workload,
)

pytestmark = pytest.mark.timeout(30)

run = STRATEGIES["simple"].run


def recommend(history, *, ceilings=None, prices=None, **changes):  # type: ignore[no-untyped-def]
    return run(history, hardware(ceilings, prices), settings(**changes))


def test_each_sample_workload_gets_its_known_answer() -> None:
    answers = {
        w.name: recommend(w, ceilings=Ceilings({(H100, "bf16"): 800e12}, {H100: 3e12}))
        for w in sample_workloads()
    }
    summary = {
        name: (r.classification, r.action, r.target.label if r.target else None)
        for name, r in answers.items()
    }
    assert summary == {
        "notebook": (IDLE, "release", None),
        "chat|small": (UNDERUSED, "move", "A100 80GB SXM MIG 1g.10gb"),
        "embed": (MEMORY_BOUND, "keep", "A100 80GB SXM"),
        "llm": (COMPUTE_BOUND, "keep", "H100 SXM"),
        "resnet": (INPUT_BOUND, "add CPU", "A100 40GB SXM"),
        "<new>": (UNDEFINED, "none", "H100 SXM"),
        "ocr": (RIGHT_SIZED, "keep", "L4"),
    }
    assert "no process on it 98% of the time" in answers["notebook"].reason
    assert "SM activity p95 7% of A100 80GB SXM" in answers["chat|small"].reason
    assert answers["chat|small"].demand is not None
    assert answers["chat|small"].demand.roofline_side == "memory"  # DRAM 4% > tensor 3%
    assert "memory capacity" in answers["embed"].reason
    assert "compute-bound side of the roofline" in answers["llm"].reason
    assert answers["<new>"].reason == "not enough data: 2h of history, needs 6h"


def test_input_bound_raises_the_cpu_limit_in_proportion_to_the_gpu_headroom() -> None:
    history = workload(
        device(model=A100_40, busy=0.4, busy_mean=0.35),
        cpu=(ContainerCpu("main", 3.95, 4.0), ContainerCpu("sidecar", 0.1, 1.0)),
    )
    recommendation = recommend(history)
    assert recommendation.classification == INPUT_BOUND
    (change,) = recommendation.cpu_changes  # the sidecar is nowhere near its limit
    # 80% saturation / 35% mean busy = 2.29x of 4 cores = 9.14, rounded up to half a core.
    assert (change.container, change.limit_cores, change.recommended_cores) == ("main", 4.0, 9.5)
    assert "raise its CPU limit to 9.5" in recommendation.reason


def test_cpu_at_its_limit_is_not_input_bound_when_the_gpu_is_saturated() -> None:
    history = workload(
        device(busy=0.95, sm_quantile=0.9, memory_gib=70), cpu=(ContainerCpu("main", 4.0, 4.0),)
    )
    assert recommend(history).classification == COMPUTE_BOUND


def test_a_mig_instance_moves_to_a_smaller_profile() -> None:
    history = workload(device(mig_profile="3g.40gb", busy=0.2, memory_gib=5))
    recommendation = recommend(history)
    assert recommendation.current is not None
    assert recommendation.current.label == "H100 SXM MIG 3g.40gb"
    # 20% of a 60-SM slice is 9% of the GPU; x1.2 headroom fits 1g.10gb's 16 of 132 SMs.
    assert recommendation.classification == UNDERUSED
    assert recommendation.target is not None
    assert recommendation.target.label == "H100 SXM MIG 1g.10gb"


def test_models_setting_limits_where_a_workload_may_move() -> None:
    light = workload(device(busy=0.05, memory_gib=5))

    def target(models: tuple[str, ...], seen: tuple[str, ...] = ()) -> str:
        found = run(light, replace(hardware(), seen=seen), settings(models=models)).target
        assert found is not None
        return found.label

    # Anywhere: a whole T4 covers 5% of an H100 (scaled by the larger of the FLOP/s and
    # bandwidth ratios) for $0.53/h; only L4s: an L4; only what the cluster has: an H100 slice.
    assert target(("all",)) == "T4"
    assert target(("l4",)) == "L4"
    assert target(("seen",)) == "H100 SXM MIG 1g.10gb"
    assert target(("seen",), seen=(H100, L4)) == "L4"
    # Its own model's MIG profiles are always allowed; a model without a price never is.
    assert target(("b200",)) == "H100 SXM MIG 1g.10gb"


def test_multi_gpu_pods_are_never_offered_mig() -> None:
    history = workload(*(device(uuid=f"GPU-{i}", busy=0.1, memory_gib=5) for i in range(4)))
    recommendation = recommend(history)
    assert recommendation.classification == UNDERUSED
    assert recommendation.target is not None
    assert recommendation.target.mig_profile is None


def test_shared_gpu_sizes_from_per_pod_utilization_and_costs_a_share() -> None:
    shared = device(
        uuid="GPU-s",
        model=A100_80,
        busy=0.2,
        memory_gib=10,
        shared=True,
        holders=2,
        sm_quantile=0.9,
        sm_mean=0.9,
    )
    recommendation = recommend(workload(shared))
    assert recommendation.current is not None
    assert recommendation.current.label == "A100 80GB SXM (shared by 2)"
    assert recommendation.current.share == 0.5
    assert recommendation.demand is not None
    # Device-wide SM activity belongs to both holders: the pod's own utilization sizes it.
    assert recommendation.demand.compute_signal == "utilization"
    assert recommendation.target is not None
    assert recommendation.target.label == "A100 80GB SXM MIG 2g.20gb"


def test_bandwidth_bound_workload_is_memory_bound_on_the_roofline() -> None:
    history = workload(
        device(busy=0.9, sm_quantile=0.85, sm_mean=0.8, dram_mean=0.9, memory_gib=30)
    )
    recommendation = recommend(history)
    assert recommendation.classification == MEMORY_BOUND
    assert "bandwidth-bound side of the roofline" in recommendation.reason


def test_busy_gpu_without_activity_series_says_the_side_is_unknown() -> None:
    recommendation = recommend(workload(device(busy=0.9, memory_gib=30)))
    assert recommendation.classification == COMPUTE_BOUND
    assert "roofline side unknown" in recommendation.reason


@pytest.mark.parametrize(
    ("history", "reason"),
    [
        (workload(device(held=5 * 3600)), "not enough data: 5h of history, needs 6h"),
        (
            workload(device(observed=0.3 * WINDOW)),
            "not enough data: utilization known for 30% of the held time, needs 50%",
        ),
        (
            workload(device(model="NVIDIA Imaginary 9000")),
            "GPU model 'NVIDIA Imaginary 9000' is not in the catalog",
        ),
        (
            workload(device(mig_profile="5g.60gb")),
            f"MIG profile '5g.60gb' of '{H100}' is not in the catalog",
        ),
    ],
)
def test_not_enough_data_is_an_explicit_answer(history, reason: str) -> None:  # type: ignore[no-untyped-def]
    recommendation = recommend(history)
    assert recommendation.classification == UNDEFINED
    assert recommendation.action == "none"
    assert recommendation.reason == reason


def test_history_counts_replica_time_not_wall_time() -> None:
    # Three replicas held 2.5 h each: 7.5 h of evidence.
    history = workload(*(device(uuid=f"GPU-{i}", held=2.5 * 3600) for i in range(3)), pods=3)
    assert recommend(history).classification != UNDEFINED


def test_idle_threshold_is_inclusive() -> None:
    at_threshold = workload(device(busy=0.0, busy_p99=0.02))
    above = workload(device(busy=0.0, busy_p99=0.021, memory_gib=1))
    assert recommend(at_threshold).classification == IDLE
    assert recommend(above).classification != IDLE


def test_min_savings_keeps_small_moves_from_being_recommended() -> None:
    # An L4 at 55% could go nowhere cheaper with room to spare; at 5% an A100 40GB 1g.5gb
    # (0.39/h vs 0.805/h) covers it.
    light = workload(device(model=L4, busy=0.05, memory_gib=3))
    assert recommend(light).classification == UNDERUSED
    assert recommend(light, min_savings=0.6).classification == RIGHT_SIZED


def test_unpriced_current_model_compares_only_its_own_profiles() -> None:
    recommendation = recommend(workload(device(model="NVIDIA H100 PCIe", busy=0.05, memory_gib=5)))
    assert recommendation.classification == UNDERUSED
    assert recommendation.target is not None
    assert recommendation.target.model.key == "h100-pcie"
    assert recommendation.target.mig_profile is not None


def test_price_overrides_change_the_cheapest_option() -> None:
    small = sample_workloads()[1]
    # Make A100 80GB slices dear: the cheapest cover becomes a whole T4 ($0.526/h, scaled by
    # bandwidth since the workload sits on the memory side), then an A100 40GB slice.
    recommendation = recommend(small, prices={"a100-sxm4-80gb": 9.0})
    assert recommendation.target is not None
    assert recommendation.target.label == "T4"
    recommendation = recommend(small, prices={"a100-sxm4-80gb": 9.0, "t4": 2.0})
    assert recommendation.target is not None
    assert recommendation.target.label == "A100 40GB SXM MIG 1g.10gb"


def test_calibrated_ceilings_win_over_the_datasheet() -> None:
    catalog = builtin_catalog()
    h100 = catalog.find(H100)
    assert h100 is not None
    plain = hardware()
    calibrated = hardware(Ceilings({(H100, "bf16"): 600e12}, {H100: 2.5e12}))
    assert plain.flops(h100, "bf16").value == pytest.approx(989.4e12)  # type: ignore[union-attr]
    assert calibrated.flops(h100, "bf16").source == "calibrated"  # type: ignore[union-attr]
    assert calibrated.bandwidth(h100).value == 2.5e12
    a100 = catalog.find(A100_80)
    assert a100 is not None
    assert calibrated.scale(h100, a100, "bf16", "compute") == pytest.approx(600 / 312)
    assert calibrated.scale(h100, a100, "bf16", "memory") == pytest.approx(2.5e12 / 2.039e12)
    assert calibrated.scale(h100, a100, "bf16", None) == pytest.approx(600 / 312)
    t4 = catalog.find("t4")
    assert t4 is not None
    # T4 has no bf16 figure: the nearest common precision, fp16, scales instead.
    assert plain.compute_dtype(h100, t4, "bf16") == "fp16"
    a10g = catalog.find("a10g")
    assert a10g is not None
    assert plain.scale(h100, a10g, "bf16", "compute") is None  # no FLOP figures at all


def test_option_prices_and_capacities_follow_the_catalog() -> None:
    h100 = builtin_catalog().find("h100-sxm")
    assert h100 is not None
    small = h100.mig_profile("1g.20gb")
    assert small is not None
    option = Option(h100, small)
    assert option.share == 2 / 8  # one compute slice of 7 but two memory slices of 8
    assert option.compute == pytest.approx(26 / 132)
    assert option.memory_bytes == round(19.62 * GIB)
    a100_40 = builtin_catalog().find("a100-sxm4-40gb")
    assert a100_40 is not None
    profile = a100_40.mig_profile("3g.20gb")
    assert profile is not None
    assert mig_compute_fraction(a100_40, profile) == 3 / 7  # no SM counts in the catalog
    assert Option(h100, shared_by=3).share == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--percentile=40", "invalid --percentile: 40% is outside 50..100%"),
        (
            "--compute-headroom=lots",
            "invalid --compute-headroom: 'lots' is not a percentage (e.g. 20 or 20%)",
        ),
        ("--min-history=10m", "invalid --min-history: 10m is outside 1h..90d"),
        (
            "--dtype=fp4",
            "invalid --dtype: 'fp4' is not one of fp64, fp32, tf32, fp16, bf16, fp8, int8",
        ),
        ("--models=all,l4", "invalid --models: all and seen stand alone, not in a list"),
    ],
)
def test_settings_out_of_bounds_name_the_flag(flag: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(["--prometheus=http://prometheus:9090", flag], {})
    assert str(caught.value) == message


def test_settings_accept_percent_signs_and_keep_defaults() -> None:
    loaded = load(
        [
            "--prometheus=http://prometheus:9090",
            "--percentile=99%",
            "--memory-headroom=25",
            "--models=l4, h100-sxm",
        ],
        {},
    ).settings
    assert loaded.percentile == pytest.approx(0.99)
    assert loaded.memory_headroom == pytest.approx(0.25)
    assert loaded.models == ("l4", "h100-sxm")
    assert loaded.compute_headroom == StrategySettings().compute_headroom


def test_a_report_shows_settings_as_they_are_written() -> None:
    assert settings_text(StrategySettings()) == {
        "percentile": "95%",
        "compute-headroom": "20%",
        "memory-headroom": "15%",
        "idle-utilization": "2%",
        "saturation": "80%",
        "cpu-saturation": "90%",
        "min-history": "6h",
        "min-coverage": "50%",
        "min-savings": "10%",
        "dtype": "bf16",
        "models": "all",
    }


def test_a_replica_that_never_uses_its_second_gpu_asks_for_one() -> None:
    # A 2-GPU Job: the first GPU works all week, the second idles (no memory, p99 0%).
    history = workload(
        device(uuid="GPU-0", busy=0.7, memory_gib=60),
        device(uuid="GPU-1", busy=0.0, in_use_ratio=0.0, memory_gib=0.0),
        name="train",
        kind="Job",
    )
    recommendation = recommend(history)
    assert recommendation.classification == UNDERUSED
    assert recommendation.action == "fewer GPUs"
    assert recommendation.recommended_gpus == 1
    assert recommendation.target == recommendation.current
    assert "1 of the 2 GPUs of each replica unused" in recommendation.reason
    # The demand is the used GPU's alone.
    assert recommendation.demand is not None
    assert recommendation.demand.compute == pytest.approx(0.7)


def test_fewer_gpus_counts_the_busiest_replica_and_not_an_idle_gpu_holding_memory() -> None:
    # Replica 0 uses 1 of 4, replica 1 uses 3 of 4: each needs 3.
    busy = [0.6, 0.0, 0.0, 0.0, 0.6, 0.5, 0.4, 0.0]
    history = workload(
        *(device(uuid=f"GPU-{i}", busy=b, memory_gib=40 if b else 0.0) for i, b in enumerate(busy)),
        pods=2,
    )
    assert recommend(history).recommended_gpus == 3
    # A compute-idle GPU holding 30 GiB (a shard's weights) is in use: nothing to remove.
    holding = workload(
        device(uuid="GPU-0", busy=0.6), device(uuid="GPU-1", busy=0.0, memory_gib=30)
    )
    assert recommend(holding).recommended_gpus is None
    # Every GPU idle is the idle answer, not fewer GPUs.
    idle = workload(*(device(uuid=f"GPU-{i}", busy=0.0, memory_gib=0.0) for i in range(2)))
    assert recommend(idle).classification == IDLE
