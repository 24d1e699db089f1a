"""A golden /metrics for a fixed simulated fleet, seed and clock.

Any change to names, labels, HELP texts or simulated values shows up as a diff here. After an
intended change, regenerate with `pytest tests/test_golden.py --update-golden` and review the diff.
"""

from __future__ import annotations

from tests.golden_fleet import render_fleet
from tests.helpers import ROOT, assert_promtool_accepts

GOLDEN = ROOT / "tests" / "golden" / "metrics.prom"
GOLDEN_OPENMETRICS = ROOT / "tests" / "golden" / "metrics.openmetrics"


async def test_metrics_match_the_golden_files(update_golden: bool) -> None:
    text, openmetrics = await render_fleet()
    if update_golden:
        GOLDEN.write_bytes(text)
        GOLDEN_OPENMETRICS.write_bytes(openmetrics)
    assert text.decode() == GOLDEN.read_text(), "run pytest --update-golden and review the diff"
    assert openmetrics.decode() == GOLDEN_OPENMETRICS.read_text()


async def test_rendering_is_deterministic() -> None:
    assert await render_fleet() == await render_fleet()


def test_golden_file_passes_promtool_lint() -> None:
    assert_promtool_accepts(GOLDEN.read_bytes())


def test_golden_fleet_covers_every_state() -> None:
    text = GOLDEN.read_text()
    for needle in (
        'gpu_up{gpu="3"',  # the lost A100
        "gpu_fan_speed_ratio{",  # the RTX 6000 Ada has a fan
        'gpu_ecc_errors_total{gpu="1"',
        'gpu_process_utilization_ratio{gpu="1"',  # MPS clients
        'reason="gpu_idle"',
        # GPM on a whole GPU and per MIG instance; the MIG layout after its change
        'gpu_sm_active_ratio{gpu="0"',
        'gpu_tensor_active_seconds_total{gpu="4",gpu_instance="1",mig_profile="3g.40gb"',
        'gpu_nvlink_transmit_bytes_per_second{gpu="0"',
        'gpu_instance="3",mig_profile="2g.20gb"',
        'parent_uuid="GPU-',
        'gpu_mig_mode_enabled{gpu="4"',
        # throttle time, row remapping (A100 and newer), page retirement (V100)
        'gpu_throttle_seconds_total{gpu="2",model="NVIDIA RTX 6000 Ada Generation",reason="low_utilization"',
        'gpu_remapped_rows_pending{gpu="0"',
        'gpu_retired_pages{cause="double_bit",gpu="5"',
        # field values: memory temperature on HBM boards, NVLink traffic per link
        'gpu_memory_temperature_celsius{gpu="5"',
        'gpu_nvlink_transmit_bytes_total{gpu="0",link="17"',
        'gpu_nvlink_errors_total{gpu="5",link="5",model="Tesla V100-SXM2-32GB",type="crc_flit"',
        'gpu_graphics_active_ratio{gpu="4",gpu_instance="1",mig_profile="3g.40gb"',
        'gpu_compute_mode_info{gpu="2",mode="default"',
    ):
        assert needle in text, needle
    assert 'gpu_memory_temperature_celsius{gpu="1"' not in text, "GDDR (L4): absent, not 0"
    assert 'gpu_nvlink_transmit_bytes_total{gpu="1"' not in text, "no NVLink on an L4"
    assert 'link="18"' not in text, "an H100 has 18 links"
    assert 'link="6",model="Tesla V100' not in text, "a V100 has 6"
    assert 'gpu_instance="4"' not in text, "the instance destroyed by the layout change"
    assert 'gpu_utilization_ratio{gpu="4"' not in text, "no utilization in MIG mode"
    assert 'gpu_up{gpu="3",model="NVIDIA A100-SXM4-40GB"' in text
    assert 'gpu_pcie_replays_total{gpu="0"' not in text, "unsupported on GPU 0: absent, not 0"


def test_every_exported_metric_is_documented_in_the_metrics_reference() -> None:
    readme = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    names = {
        line.split()[2] for line in GOLDEN.read_text().splitlines() if line.startswith("# TYPE")
    }
    undocumented = sorted(name for name in names if f"| `{name}` |" not in readme)
    assert not undocumented, f"add these to the metrics reference: {undocumented}"
