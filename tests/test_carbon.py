"""The grid's carbon intensity: --carbon.intensity (flag, environment, config file), the catalog's
`carbon_intensity_grams_per_kwh`, which wins, the gauge, and the chart's `carbon.intensity`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from exporter import config
from exporter.catalog import CatalogError, builtin_catalog, catalog_from_file
from exporter.cli import build_parser
from exporter.config import ConfigError, ServeConfig
from exporter.metrics.exposition import TEXT
from exporter.metrics.families import BuildInfo
from exporter.sampling import SamplingLoop
from exporter.simulator import SimulatedNvml, load_fleet
from tests.helpers import FLEETS, ROOT, ManualClock, require_tool, series, value

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.catalog import Catalog

GAUGE = "gpuscope_grid_carbon_intensity_grams_per_kwh"


def load(argv: list[str], environ: dict[str, str] | None = None) -> ServeConfig:
    args = build_parser().parse_args(["serve", *argv])
    flags = {key: value for key, value in vars(args).items() if key != "command"}
    return config.load(flags, environ or {})


def test_the_setting_comes_from_flag_environment_or_config_file(tmp_path: Path) -> None:
    assert load([]).carbon_intensity is None
    assert load(["--carbon.intensity=385.5"]).carbon_intensity == 385.5
    assert load([], {"GPUSCOPE_CARBON_INTENSITY": "0"}).carbon_intensity == 0.0
    file = tmp_path / "gpuscope.yaml"
    file.write_text("carbon:\n  intensity: 120\n")
    assert load([f"--config.file={file}"]).carbon_intensity == 120.0
    environ = {"GPUSCOPE_CARBON_INTENSITY": "50"}
    assert load([f"--config.file={file}"], environ).carbon_intensity == 50.0


@pytest.mark.parametrize("spelled", ["-1", "10001", "nan", "inf", "lots", ""])
def test_a_bad_intensity_is_one_line_naming_the_setting(spelled: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load([f"--carbon.intensity={spelled}"])
    message = str(caught.value)
    assert message.startswith("invalid --carbon.intensity: ")
    assert "\n" not in message


def test_a_bad_intensity_stops_the_daemon_with_exit_status_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--simulate=1", "--carbon.intensity=-5"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--carbon.intensity" in lines[0]
    assert "outside 0..10000" in lines[0]


def test_the_catalog_gives_an_intensity_and_refuses_a_bad_one(tmp_path: Path) -> None:
    assert builtin_catalog().carbon_intensity is None
    file = tmp_path / "catalog.yaml"
    file.write_text("carbon_intensity_grams_per_kwh: 56\n")
    catalog = catalog_from_file(file)
    assert catalog.carbon_intensity == 56.0
    assert catalog.models == builtin_catalog().models  # laid over the built-in one
    file.write_text("extend_builtin: false\ncarbon_intensity_grams_per_kwh: 12.5\nmodels: []\n")
    assert catalog_from_file(file).carbon_intensity == 12.5
    for bad, problem in (
        ("-3", "below 0"),
        ("20000", "above 10000"),
        ("lots", "expected a number"),
        ("true", "expected a number"),
    ):
        file.write_text(f"carbon_intensity_grams_per_kwh: {bad}\n")
        with pytest.raises(CatalogError, match=f"carbon_intensity_grams_per_kwh: .*{problem}"):
            catalog_from_file(file)


async def exposition(settings: ServeConfig, catalog: Catalog | None = None) -> str:
    clock = ManualClock()
    sampling = SamplingLoop(
        settings,
        SimulatedNvml(load_fleet(FLEETS / "golden.yaml"), clock=clock),
        build=BuildInfo(version="0.0.0"),
        clock=clock,
        catalog=catalog,
    )
    await sampling.start()
    try:
        return sampling.cycle().render(TEXT).body.decode()
    finally:
        await sampling.close()


async def test_the_gauge_is_the_setting_else_the_catalogs_else_absent(tmp_path: Path) -> None:
    file = tmp_path / "catalog.yaml"
    file.write_text("carbon_intensity_grams_per_kwh: 410\n")
    catalog = catalog_from_file(file)
    assert series(await exposition(ServeConfig()), GAUGE) == {}
    assert value(await exposition(ServeConfig(), catalog), GAUGE) == 410.0
    overridden = replace(ServeConfig(), carbon_intensity=0.0)
    assert value(await exposition(overridden, catalog), GAUGE) == 0.0
    (labels,) = series(await exposition(overridden, catalog), GAUGE)
    assert labels == frozenset()  # no labels at all


def helm_template(*switches: str) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart; a switch is `--set X=Y` or `--set-json X=Y`."""
    command = [require_tool("helm"), "template", "gpuscope", str(ROOT / "helm" / "gpuscope")]
    for switch in switches:
        command += switch.split(" ", 1)
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_the_chart_passes_carbon_intensity_to_the_daemon_only_when_set() -> None:
    assert "--carbon.intensity" not in helm_template().stdout
    for switch, flag in (
        ("--set carbon.intensity=385.5", "--carbon.intensity=385.5"),
        ("--set-json carbon.intensity=0", "--carbon.intensity=0"),
        ("--set-json carbon.intensity=120", "--carbon.intensity=120"),
    ):
        rendered = helm_template(switch)
        assert rendered.returncode == 0, rendered.stderr
        assert f"- {flag}\n" in rendered.stdout
    for refused in ("--set-json carbon.intensity=-1", "--set carbon.intensity=lots"):
        rendered = helm_template(refused)
        assert rendered.returncode != 0
        assert "/carbon/intensity" in rendered.stderr
