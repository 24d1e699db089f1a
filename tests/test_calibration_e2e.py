"""The daemon with calibration profiles, as a user runs it: `gpuscope serve --simulate FILE
--calibration.path DIR`, scraped over HTTP while the profile directory changes under it."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from exporter.calibration.profile import configmap_key, dump_profile
from exporter.documents import MAX_DOCUMENT_BYTES
from tests.helpers import ROOT, assert_promtool_accepts, running_daemon, series, value
from tests.mounted_configmap import publish
from tests.profiles import gpu_profile
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow
FLEET = str(ROOT / "examples" / "fleet.yaml")  # GPUs 0, 1: H100; 2: A100 80GB; 3: L4
H100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA L4"


def test_daemon_exports_calibrated_and_datasheet_series_and_survives_a_corrupt_profile(
    tmp_path: Path,
) -> None:
    profiles = tmp_path / "calibration"
    broken_key = configmap_key(L4)
    publish(
        profiles,
        {configmap_key(H100): dump_profile(gpu_profile()), broken_key: '{"kind": "gpuscope/cal'},
        generation=1,
    )
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "models:\n"
        "  - key: h100-sxm\n"
        "    prices:\n"
        "      - {provider: aws, region: us-east-1, instance: p5.48xlarge, usd_per_hour: 5.5,"
        " source_date: '2026-11'}\n"
    )
    with running_daemon(
        f"--simulate={FLEET}",
        "--collect.interval=100ms",
        f"--calibration.path={profiles}",
        f"--catalog.file={catalog}",
    ) as daemon:
        daemon.wait_ready()
        daemon.wait_cycles(10)  # the corrupt profile must still be reported only once
        text = daemon.metrics()

        assert value(text, "gpu_calibrated_flops", gpu="0", dtype="bf16") == 7.92e14
        assert value(text, "gpu_calibrated_flops", gpu="1", dtype="bf16") == 7.92e14
        assert not series(text, "gpu_calibrated_flops", dtype="int8"), "skipped: no series"
        assert value(text, "gpu_calibrated_memory_bandwidth_bytes_per_second", gpu="0") == 3.1e12
        assert value(text, "gpu_calibrated_host_to_device_bytes_per_second", gpu="0") == 5.3e10
        assert value(text, "gpu_calibrated_device_to_host_bytes_per_second", gpu="0") == 5.1e10
        assert value(text, "gpu_calibrated_launch_latency_seconds", gpu="0") == 6.0e-6
        assert not series(text, "gpu_calibrated_flops", gpu="3"), "the L4's profile is corrupt"
        assert value(text, "gpu_datasheet_flops", gpu="3", dtype="fp8") == 2.425e14
        assert value(text, "gpu_datasheet_memory_bandwidth_bytes_per_second", gpu="2") == 2.039e12
        assert value(text, "gpu_price_usd_per_hour", gpu="0") == 5.5  # the user's catalog
        assert value(text, "gpu_price_usd_per_hour", gpu="3") == 0.805  # the built-in one
        assert value(text, "gpuscope_collector_success", collector="calibration") == 0
        assert value(text, "gpuscope_collector_success", collector="nvml") == 1
        rejected = [line for line in daemon.log_lines if "calibration profile rejected" in line]
        assert len(rejected) == 1, daemon.log_lines
        assert broken_key in rejected[0]
        assert "not valid JSON" in rejected[0]

        assert_promtool_accepts(text)

        publish(
            profiles,
            {
                configmap_key(H100): dump_profile(gpu_profile()),
                broken_key: dump_profile(gpu_profile(L4, catalog_key="l4", duration_seconds=30.0)),
            },
            generation=2,
        )
        text = daemon.metrics_until(
            lambda t: bool(series(t, "gpu_calibrated_flops", gpu="3", dtype="fp32")),
            10,
            "the fixed L4 profile's series",
        )
        assert value(text, "gpu_calibrated_flops", gpu="3", dtype="fp32") == 5.1e13
        assert value(text, "gpuscope_collector_success", collector="calibration") == 1
    assert sum("calibration profiles loaded" in line for line in daemon.log_lines) == 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            "--calibration.path=/no/such/profiles",
            "invalid --calibration.path: '/no/such/profiles': no such file or directory",
        ),
        (
            "--catalog.file=/no/such/catalog.yaml",
            "invalid --catalog.file: '/no/such/catalog.yaml' is not a readable file",
        ),
    ],
)
def test_missing_paths_exit_2_naming_the_flag(flag: str, message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--simulate=1", flag],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"gpuscope: error: {message}"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            b"models:\n  - key: quantum-9000\n    name: Quantum\n",
            (
                "models[0]: missing fields nvml_names, architecture, memory_gib, "
                "memory_bandwidth_gbps, tdp_watts"
            ),
        ),
        (alias_bomb().encode(), "expands to more than 100,000 values (aliases repeated?)"),
        (b"models: []\n\xff\xd8\xff\xe0", "not UTF-8 text (byte 11 is 0xff)"),
        (b"models: []\nmodels: []\n", "key 'models' appears twice in one mapping (line 2)"),
        (b"#" * (MAX_DOCUMENT_BYTES + 1), "larger than 1 MiB (the limit)"),
    ],
    ids=["incomplete", "alias-bomb", "binary", "duplicate-key", "oversized"],
)
def test_a_malformed_catalog_exits_2_with_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--simulate=1", f"--catalog.file={catalog}"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpuscope: error: invalid --catalog.file: {catalog}: {problem}"
    ]
