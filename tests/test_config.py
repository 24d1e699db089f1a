from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

import pytest

from exporter import config
from exporter.cli import build_parser
from exporter.config import ConfigError, ListenAddress, ServeConfig

if TYPE_CHECKING:
    from pathlib import Path


def load(argv: list[str], environ: dict[str, str] | None = None) -> ServeConfig:
    args = build_parser().parse_args(["serve", *argv])
    flags = {key: value for key, value in vars(args).items() if key != "command"}
    return config.load(flags, environ or {})


def test_defaults_follow_the_contract() -> None:
    settings = load([])
    assert settings.listen_address == ListenAddress(None, 9455)
    assert str(settings.listen_address) == ":9455"
    assert settings.telemetry_path == "/metrics"
    assert settings.collect_interval == 1.0
    assert settings.log_format == "logfmt"
    assert settings.simulate is None


def test_config_is_frozen() -> None:
    settings = load([])
    with pytest.raises(AttributeError):
        settings.collect_interval = 5.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("spelled", "host", "port"),
    [
        (":9455", None, 9455),
        ("127.0.0.1:0", "127.0.0.1", 0),
        ("[::1]:80", "::1", 80),
        ("localhost:9", "localhost", 9),
    ],
)
def test_listen_addresses(spelled: str, host: str | None, port: int) -> None:
    assert load([f"--web.listen-address={spelled}"]).listen_address == ListenAddress(host, port)


def test_precedence_is_flag_then_environment_then_file(tmp_path: Path) -> None:
    file = tmp_path / "gpuscope.yaml"
    file.write_text("collect:\n  interval: 5s\nlog:\n  level: debug\n  format: json\n")
    environ = {"GPUSCOPE_CONFIG_FILE": str(file), "GPUSCOPE_LOG_LEVEL": "warn"}
    settings = load(["--log.format=logfmt"], environ)
    assert settings.collect_interval == 5.0  # file
    assert settings.log_level == "warn"  # environment beats file
    assert settings.log_format == "logfmt"  # flag beats file
    assert settings.config_file == file


def test_environment_names_derive_from_flags() -> None:
    names = {setting.flag: setting.env for setting in config.SETTINGS}
    assert names["--web.listen-address"] == "GPUSCOPE_WEB_LISTEN_ADDRESS"
    assert names["--collect.interval"] == "GPUSCOPE_COLLECT_INTERVAL"


@pytest.mark.parametrize(
    ("argv", "environ", "setting"),
    [
        (["--collect.interval=5x"], {}, "--collect.interval"),
        (["--collect.interval=10ms"], {}, "--collect.interval"),
        (["--collect.interval=1"], {}, "--collect.interval"),
        (["--web.listen-address=9455"], {}, "--web.listen-address"),
        (["--web.listen-address=:70000"], {}, "--web.listen-address"),
        (["--web.telemetry-path=metrics"], {}, "--web.telemetry-path"),
        (["--web.telemetry-path=/-/metrics"], {}, "--web.telemetry-path"),
        (["--log.level=verbose"], {}, "--log.level"),
        (["--log.format=xml"], {}, "--log.format"),
        (["--collect.processes=maybe"], {}, "--collect.processes"),
        (["--simulate=0"], {}, "--simulate"),
        (["--simulate=/nonexistent/fleet.yaml"], {}, "--simulate"),
        ([], {"GPUSCOPE_COLLECT_INTERVAL": "fast"}, "GPUSCOPE_COLLECT_INTERVAL"),
    ],
)
def test_bad_values_name_the_setting(
    argv: list[str], environ: dict[str, str], setting: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(argv, environ)
    message = str(caught.value)
    assert message.startswith(f"invalid {setting}: ")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("collect:\n  intervall: 1s\n", "collect.intervall: unknown setting"),
        ("collect:\n  interval: 5x\n", "invalid collect.interval in "),
        ("- just\n- a list\n", "expected a mapping, got a list"),
        ("collect:\n  interval: 1s\ncollect:\n  interval: 2s\n", "key 'collect' appears twice"),
        ("collect: [unclosed\n", "not valid YAML at line"),
        ("config:\n  file: other.yaml\n", "config.file: unknown setting"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path: Path, content: str, problem: str) -> None:
    file = tmp_path / "gpuscope.yaml"
    file.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load([f"--config.file={file}"])


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--config\.file"):
        load([f"--config.file={tmp_path / 'absent.yaml'}"])


def test_empty_config_file_means_defaults(tmp_path: Path) -> None:
    file = tmp_path / "empty.yaml"
    file.write_text("")
    assert load([f"--config.file={file}"]).collect_interval == 1.0


def test_yaml_values_keep_their_types(tmp_path: Path) -> None:
    file = tmp_path / "gpuscope.yaml"
    file.write_text("collect:\n  processes: false\nsimulate: 2\n")
    settings = load([f"--config.file={file}"])
    assert settings.collector_processes is False
    assert settings.simulate == "2"


def test_every_setting_has_a_flag_in_help() -> None:
    parser = build_parser()
    serve = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ).choices["serve"]
    help_text = serve.format_help()
    for setting in config.SETTINGS:
        assert setting.flag in help_text
        assert setting.env in help_text


def test_collectors_switch_off_by_flag_environment_file_and_the_old_alias(tmp_path: Path) -> None:
    assert load([]).collectors == {name for name, _ in config.COLLECTORS} - config.OFF_BY_DEFAULT
    assert {"processes", "nvlink"} <= load(
        ["--collector.processes", "--collector.nvlink"]
    ).collectors
    assert "gpm" not in load(["--no-collector.gpm"]).collectors
    assert "gpm" not in load(["--collector.gpm=false"]).collectors
    assert "gpm" in load(["--no-collector.gpm", "--collector.gpm"]).collectors, "the last wins"
    assert "mig" not in load([], {"GPUSCOPE_COLLECTOR_MIG": "false"}).collectors
    file = tmp_path / "gpuscope.yaml"
    file.write_text("collector:\n  pcie: false\n  events: off\n")
    assert {"pcie", "events"}.isdisjoint(load([f"--config.file={file}"]).collectors)
    assert "processes" in load(["--collect.processes=true"]).collectors
    assert "processes" not in load(["--collect.processes=false"]).collectors
    with pytest.raises(ConfigError, match=r"invalid --collector\.gpm"):
        load(["--collector.gpm=sometimes"])


def test_calibration_and_catalog_paths_from_flag_environment_and_file(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("models: []\n")
    file = tmp_path / "gpuscope.yaml"
    file.write_text(f"calibration:\n  path: {profiles}\ncatalog:\n  file: {catalog}\n")
    settings = load([f"--config.file={file}"])
    assert (settings.calibration_path, settings.catalog_file) == (profiles, catalog)
    settings = load([], {"GPUSCOPE_CALIBRATION_PATH": str(catalog)})  # a single profile file
    assert settings.calibration_path == catalog
    assert settings.catalog_file is None
    with pytest.raises(
        ConfigError, match=r"invalid --catalog.file: '.*profiles' is not a readable"
    ):
        load([f"--catalog.file={profiles}"])
