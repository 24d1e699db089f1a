"""`gpuscope calibrate` as a user runs it — its settings from flags, variables and a file, checked
without PyTorch — and the daemon's promise never to load PyTorch."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest
import yaml
from aiohttp import web

from exporter.calibrate import options
from exporter.calibration.parse import parse_profile_text
from exporter.calibration.profile import configmap_key, dump_profile
from exporter.cli import build_parser
from tests.fake_kube.configmaps import add_configmap_routes
from tests.helpers import FLEETS, ROOT
from tests.profiles import gpu_profile, require_pytorch
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from aiohttp.test_utils import TestServer

pytestmark = pytest.mark.slow


@pytest.fixture
def pytorch() -> None:
    """The tests that get as far as a calibration need PyTorch."""
    require_pytorch()


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST"}
    }
    return {**env, **extra}


def calibrate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", "calibrate", *args],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        env=env or clean_env(),
        check=False,
    )


def test_without_pytorch_one_line_says_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if PyTorch were not installed
        from exporter.cli import main
        sys.exit(main(["calibrate", "--quick"]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        (
            "gpuscope calibrate: error: needs gpuscope[calibrate] (torch not installed): "
            "pip install 'gpuscope[calibrate]'"
        )
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "tpu"], "invalid --device: 'tpu' is not auto, cpu, cuda or cuda:N"),
        (
            ["--output", "profile.txt"],
            "invalid --output: 'profile.txt' must end in .json, .yaml or .yml",
        ),
        (
            ["--output", "/no/such/dir/p.json"],
            "invalid --output: directory '/no/such/dir' does not exist",
        ),
        (
            ["--configmap", "gpuscope"],
            "invalid --configmap: 'gpuscope' is not NAMESPACE/NAME (lower-case DNS names)",
        ),
        (
            ["--configmap", "Bad_NS/x"],
            "invalid --configmap: 'Bad_NS/x' is not NAMESPACE/NAME (lower-case DNS names)",
        ),
        (
            ["--kubeconfig", "/no/such/file"],
            "invalid --kubeconfig: '/no/such/file' is not a readable file",
        ),
        (
            ["--log.level", "loud"],
            "invalid --log.level: 'loud' is not one of debug, info, warn, error",
        ),
        (["--quick=maybe"], "invalid --quick: 'maybe' is not a boolean (true or false)"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = calibrate(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"gpuscope: error: {message}"]


def test_a_bad_variable_or_config_file_exits_2_with_one_line(tmp_path: Path) -> None:
    result = calibrate(env=clean_env(GPUSCOPE_CALIBRATE_DEVICE="tpu"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpuscope: error: invalid GPUSCOPE_CALIBRATE_DEVICE: 'tpu' is not auto, cpu, cuda or cuda:N"
    ]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    result = calibrate(f"--config.file={bomb}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        (
            f"gpuscope: error: invalid --config.file: {bomb}: expands to more than 100,000 values"
            " (aliases repeated?)"
        ),
    ]


def parsed(*argv: str, environ: dict[str, str] | None = None) -> options.CalibrateOptions:
    return options.parse(build_parser().parse_args(["calibrate", *argv]), environ or {})


def test_settings_come_from_flags_then_variables_then_the_file(tmp_path: Path) -> None:
    settings = tmp_path / "calibrate.yaml"
    settings.write_text(
        f"device: cpu\nquick: true\noutput: {tmp_path / 'p.yaml'}\nlog: {{level: debug}}\n"
    )
    environ = {
        "GPUSCOPE_CALIBRATE_CONFIG_FILE": str(settings),
        "GPUSCOPE_CALIBRATE_LOG_LEVEL": "warn",
        "GPUSCOPE_CALIBRATE_DEVICE": "cuda",
    }
    found = parsed("--device=CUDA:1", environ=environ)
    assert (found.device, found.quick, found.log_level) == ("cuda:1", True, "warn")
    assert (found.output_file, found.output_format) == (tmp_path / "p.yaml", "yaml")
    assert not found.to_stdout
    assert parsed("--no-quick", environ=environ).quick is False
    settings.write_text("devise: cpu\n")
    with pytest.raises(options.OptionError, match=r": devise: unknown setting$"):
        parsed(environ=environ)


@pytest.mark.parametrize(
    ("argv", "to_file", "to_stdout"),
    [
        ([], False, True),
        (["--output=-"], False, True),
        (["--configmap=gpuscope/calibration"], False, False),
        (["--configmap=gpuscope/calibration", "--output=-"], False, True),
        (["--output={dir}/p.json"], True, False),
    ],
)
def test_where_the_profile_goes(
    tmp_path: Path, argv: list[str], to_file: bool, to_stdout: bool
) -> None:
    found = parsed(*(arg.format(dir=tmp_path) for arg in argv))
    assert (found.output_file is not None, found.to_stdout) == (to_file, to_stdout)
    assert found.output_format == "json"


def test_settings_are_checked_without_pytorch_rich_or_kubernetes() -> None:
    code = textwrap.dedent(
        """
        import sys
        from exporter.calibrate import options
        from exporter.cli import build_parser
        options.parse(build_parser().parse_args(["calibrate", "--device=cpu", "--quick"]), {})
        loaded = sorted(
            m for m in sys.modules if m.split(".")[0] in {"torch", "rich", "kubernetes"}
        )
        print(",".join(loaded))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"checking the settings loaded {result.stdout.strip()}"
    help_text = calibrate("--help")
    assert help_text.returncode == 0
    assert "[env GPUSCOPE_CALIBRATE_DEVICE]" in " ".join(help_text.stdout.split())


@pytest.mark.usefixtures("pytorch")
def test_a_configmap_without_any_kubernetes_configuration_exits_2() -> None:
    result = calibrate("--quick", "--device", "cpu", "--configmap", "gpuscope/calibration")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "gpuscope: error: no Kubernetes API to write to: not in a cluster, and neither "
        "--kubeconfig nor KUBECONFIG is set"
    )


@pytest.mark.usefixtures("pytorch")
def test_a_gpu_asked_for_on_a_machine_without_one_exits_1() -> None:
    result = calibrate("--quick", "--device", "cuda")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuscope: error: no CUDA device: torch ")
    assert last.endswith("(use --device cpu to run on the CPU)")


@pytest.mark.usefixtures("pytorch")
def test_a_bad_catalog_exits_2(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("models:\n  - {key: l4, prise: 1}\n")
    result = calibrate("--quick", "--device", "cpu", "--catalog.file", str(catalog))
    assert result.returncode == 2
    assert "invalid --catalog.file" in result.stderr
    assert "models[0]: unknown field 'prise'" in result.stderr


@pytest.mark.usefixtures("pytorch")
async def test_quick_cpu_run_writes_the_file_and_merges_into_the_configmap(
    tmp_path: Path, aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]
) -> None:
    app = web.Application()
    store = add_configmap_routes(app)
    store.put("gpuscope", "gpuscope-calibration", {"nvidia-l4.json": "kept as it was"})
    server = await aiohttp_server(app)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "fake", "cluster": {"server": str(server.make_url("")).rstrip("/")}}
                ],
                "users": [{"name": "fake", "user": {"token": "test"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    output = tmp_path / "profile.yaml"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "exporter",
        "calibrate",
        "--quick",
        "--device=cpu",
        f"--output={output}",
        "--configmap=gpuscope/gpuscope-calibration",
        f"--kubeconfig={kubeconfig}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=clean_env(),
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    log = stderr.decode()
    assert process.returncode == 0, log
    assert stdout == b"", "with --output and --configmap nothing goes to standard output"
    profile = parse_profile_text(output.read_text(), source=str(output))
    assert profile.device == "cpu"
    stored = store.get("gpuscope", "gpuscope-calibration")
    assert stored is not None
    key = configmap_key(profile.model)
    assert set(stored["data"]) == {"nvidia-l4.json", key}
    assert stored["data"]["nvidia-l4.json"] == "kept as it was"
    assert parse_profile_text(stored["data"][key], source=key, fmt="json") == profile
    assert log.count("msg=measured ") == 13, "plain log lines when stderr is not a terminal"
    assert f'configmap="gpuscope/gpuscope-calibration[{key}] updated"' in log


@pytest.mark.usefixtures("pytorch")
def test_default_output_is_json_on_stdout() -> None:
    result = calibrate("--quick", "--device", "cpu", "--log.level", "warn")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    profile = parse_profile_text(result.stdout, source="stdout")
    assert json.loads(result.stdout)["device"] == profile.device == "cpu"


def test_the_daemon_never_imports_pytorch(tmp_path: Path) -> None:
    (tmp_path / "h100.json").write_text(json.dumps({"placeholder": True}))
    (tmp_path / "l4.json").write_text(dump_profile(gpu_profile("NVIDIA L4")))
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        from dataclasses import replace
        from pathlib import Path
        import exporter.cli  # the console script's module, as `gpuscope serve` loads it
        from exporter.config import ServeConfig
        from exporter.metrics.families import BuildInfo
        from exporter.simulator import SimulatedNvml, load_fleet
        from exporter.sampling import SamplingLoop

        async def main():
            config = replace(ServeConfig(), calibration_path=Path({str(tmp_path)!r}))
            driver = SimulatedNvml(load_fleet(Path({str(FLEETS / "golden.yaml")!r})))
            loop = SamplingLoop(config, driver, build=BuildInfo("test"))
            await loop.start()
            text = loop.cycle().render("text").body.decode()
            await loop.close()
            assert "gpu_calibrated_flops" in text and 'dtype="bf16"' in text, text
        asyncio.run(main())
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {{"torch", "rich"}})
        print(",".join(loaded))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"the daemon loaded {result.stdout.strip()}"
