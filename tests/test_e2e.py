"""The whole program as a user runs it: `gpuscope serve --simulate ...` as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tests.helpers import (
    CYCLES,
    FLEETS,
    ROOT,
    assert_promtool_accepts,
    daemon_command,
    running_daemon,
    series,
    value,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow
EXAMPLE_FLEET = str(ROOT / "examples" / "fleet.yaml")


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        daemon_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_simulated_node_serves_realistic_metrics_that_pass_promtool() -> None:
    with running_daemon(
        f"--simulate={EXAMPLE_FLEET}", "--collect.interval=200ms", "--collector.processes"
    ) as daemon:
        daemon.wait_ready()
        text = daemon.wait_cycles(5)  # GPM activity needs two samples; utilization settles
        status, headers, openmetrics = daemon.get(
            headers={"Accept": "application/openmetrics-text;version=1.0.0"}
        )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert [f.name for f in parse_openmetrics(openmetrics.decode())]

    up = [dict(labels) for labels in series(text, "gpu_up")]
    assert len([labels for labels in up if "gpu_instance" not in labels]) == 5
    assert sorted(labels["mig_profile"] for labels in up if "gpu_instance" in labels) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    assert value(text, "gpu_sm_active_ratio", gpu="0", uuid=up[0]["uuid"]) > 0.5
    assert {dict(labels)["model"] for labels in series(text, "gpu_info")} == {
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA L4",
    }
    assert value(text, "gpu_utilization_ratio", gpu="0") > 0.8
    assert value(text, "gpu_utilization_ratio", gpu="2") == 0.0
    assert value(text, "gpu_process_memory_used_bytes", gpu="0", pid="4101") == 71 * 2**30
    assert 400 < value(text, "gpu_power_watts", gpu="0") <= 700
    assert value(text, "gpu_power_watts", gpu="2") < 100
    assert value(text, "gpu_clock_event_active", gpu="2", reason="gpu_idle") == 1
    assert value(text, "gpuscope_collector_success", collector="nvml") == 1

    assert_promtool_accepts(text)


def test_busy_counter_rate_is_the_average_utilization() -> None:
    with running_daemon(
        f"--simulate={FLEETS / 'golden.yaml'}", "--collect.interval=100ms"
    ) as daemon:
        daemon.wait_ready()
        first = daemon.metrics()
        second = daemon.wait_cycles(20, since=value(first, CYCLES))  # 2 s of busy time to average
    elapsed = value(second, "gpuscope_last_sample_timestamp_seconds") - value(
        first, "gpuscope_last_sample_timestamp_seconds"
    )
    busy = value(second, "gpu_busy_seconds_total", gpu="0") - value(
        first, "gpu_busy_seconds_total", gpu="0"
    )
    assert 0.8 < busy / elapsed < 1.0  # a steady 0.9 process


def test_sigint_stops_with_status_0() -> None:
    with running_daemon("--simulate=1") as daemon:
        daemon.wait_ready()
        daemon.process.send_signal(signal.SIGINT)
        assert daemon.process.wait(10) == 0


@pytest.mark.parametrize(
    ("args", "env", "setting"),
    [
        (["--collect.interval=5x"], {}, "--collect.interval"),
        (["--web.listen-address=nonsense"], {}, "--web.listen-address"),
        (["--log.format=xml"], {}, "--log.format"),
        ([], {"GPUSCOPE_COLLECT_INTERVAL": "0s"}, "GPUSCOPE_COLLECT_INTERVAL"),
        (["--simulate=999"], {}, "--simulate"),
    ],
)
def test_bad_configuration_exits_2_naming_the_setting(
    args: list[str], env: dict[str, str], setting: str
) -> None:
    result = run(*args, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpuscope: error: invalid {setting}: ")


def test_bad_config_file_and_fleet_file_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "gpuscope.yaml"
    config.write_text("web:\n  listen-adress: :9999\n")
    result = run(f"--config.file={config}")
    assert result.returncode == 2
    assert "web.listen-adress: unknown setting" in result.stderr
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gpus:\n  - model: quantum-9000\n")
    result = run(f"--simulate={fleet}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        (
            f"gpuscope: error: --simulate {fleet}: gpus[0].model: unknown GPU model 'quantum-9000' "
            "(known: v100-sxm2-32gb, t4, a10g, l4, l40s, rtx6000-ada, a100-sxm4-40gb, a100-sxm4-80gb, h100-pcie, "
            "h100-sxm, h100-nvl, h200-sxm, b200)"
        )
    ]


def test_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("--simulate=1", f"--web.listen-address=127.0.0.1:{port}")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"gpuscope: error: cannot listen on 127.0.0.1:{port}: address already in use"


def test_json_logs() -> None:
    with running_daemon("--simulate=1", "--log.format=json") as daemon:
        daemon.wait_ready()
    # the listening line is logfmt-matched by the helper only for logfmt; check JSON parses
    records = [json.loads(line) for line in daemon.log_lines if line.startswith("{")]
    assert any(record["msg"] == "stopped" for record in records)
    assert all({"ts", "level", "msg"} <= set(record) for record in records)


def test_version_and_console_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    assert result.stdout.startswith("gpuscope ")
    script = shutil.which("gpuscope", path=os.path.dirname(sys.executable))
    assert script is not None, "the console script is installed beside the interpreter"
    result = subprocess.run(
        [script, "serve", "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0
    assert "--collect.interval" in result.stdout
