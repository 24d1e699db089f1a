"""`gpuscope serve` imports what a feature needs only when that feature is configured
(`tests/lazy_imports.py` lists them): a real daemon on the fake driver in the default
configuration never holds them, the simulated node of the benchmarks only the simulator, and a
daemon with those features configured loads them and serves what they make."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Final

import bcrypt
import pytest

from tests.fake_nvml.node import fake_env, node_state
from tests.helpers import ROOT, eventually, running_daemon
from tests.lazy_imports import loaded_lazily, modules_env, written_modules

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(90)

COUNTERS: Final = ROOT / "tests" / "fixtures" / "dcgm" / "default-counters.csv"
PASSWORD: Final = "s3cret-enough"


def test_a_daemon_in_the_default_configuration_imports_none_of_them(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    state = node_state().write(tmp_path / "state")
    env = {**fake_env(fake_lib_dir, state), **modules_env(tmp_path)}
    with running_daemon("--collect.interval=200ms", env=env) as daemon:
        daemon.wait_ready()
        daemon.wait_cycles(3)
        assert "gpu_up{" in daemon.metrics()
        assert daemon.stop() == 0
    assert loaded_lazily(written_modules(tmp_path)) == []


def test_the_simulated_node_imports_the_simulator_only(tmp_path: Path) -> None:
    with running_daemon(
        "--simulate=2", "--collect.interval=200ms", env=modules_env(tmp_path)
    ) as daemon:
        daemon.wait_ready()
        daemon.wait_cycles(3)
        assert daemon.stop() == 0
    modules = written_modules(tmp_path)
    assert "exporter.simulator" in modules
    assert loaded_lazily(modules, but=["exporter.simulator"]) == []


def test_configured_features_import_what_they_need_and_work(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    state = node_state().write(tmp_path / "state")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"basic_auth_users: {{prometheus: '{hashed}'}}\n", encoding="utf-8")
    token = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    profiles = tmp_path / "calibration"
    profiles.mkdir()
    env = {**fake_env(fake_lib_dir, state), **modules_env(tmp_path)}
    with running_daemon(
        "--compat.dcgm",
        f"--compat.dcgm-counters={COUNTERS}",
        f"--web.config.file={web_config}",
        f"--calibration.path={profiles}",
        "--collect.interval=200ms",
        env=env,
    ) as daemon:
        daemon.wait_ready()
        assert daemon.get()[0] == 401

        def served() -> bytes | None:
            status, _, body = daemon.get(headers={"Authorization": f"Basic {token}"})
            return body if status == 200 and b"DCGM_FI_DEV_GPU_UTIL{" in body else None

        eventually(served, 15, "dcgm-exporter's series behind basic auth")
        assert daemon.stop() == 0
    assert loaded_lazily(written_modules(tmp_path)) == [
        "bcrypt",
        "bcrypt._bcrypt",
        "csv",
        "exporter.calibration.parse",
        "exporter.dcgm",
        "exporter.dcgm.fields",
        "exporter.dcgm.versions",
        "exporter.dcgm.xids",
    ]
