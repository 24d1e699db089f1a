"""`gpuscope calibrate`'s settings, declared once and checked before anything heavy is imported.

Every setting is a row of `SETTINGS` (the machinery is `exporter.settings`, shared with `serve`):
the flag (`--device`), the variable (`GPUSCOPE_CALIBRATE_DEVICE`), the key of the optional
`--config.file` YAML (`device: cuda`), `--help` and the calibration guide's table come from it. Precedence is
flag > environment > file > default; anything wrong is one line and exit status 2.

Kept free of PyTorch, rich and the Kubernetes client, so `gpuscope calibrate --help` and a bad
flag answer at once, on the core install too; without the `gpuscope[calibrate]` extra the command
then says in one line what to install (`exporter.extras`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from exporter.calibration.profile import format_for
from exporter.documents import quote
from exporter.settings import (
    PATH_QUOTE_LIMIT,
    ConfigError,
    Setting,
    SettingsTable,
    one_of,
    parse_bool,
    parse_file,
    parse_path,
    text,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from exporter.documents import Format

ENV_PREFIX: Final = "GPUSCOPE_CALIBRATE_"
STDOUT: Final = Path("-")
"""`--output -`: the profile on standard output."""

OptionError = ConfigError
"""The error a setting that cannot be used raises (`exporter.cli` catches it by this name)."""

_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DEVICE: Final = re.compile(r"auto|cpu|cuda(:\d{1,3})?")


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    """Settings of `gpuscope calibrate`. Field docs are the flags' help texts (see SETTINGS)."""

    device: str = "auto"
    quick: bool = False
    output: Path | None = None
    """A profile file, `STDOUT`, or None: standard output unless --configmap is given."""
    configmap: tuple[str, str] | None = None
    """(namespace, name) of the ConfigMap to merge the profile into."""
    kubeconfig: Path | None = None
    catalog_file: Path | None = None
    config_file: Path | None = None
    log_level: str = "info"
    log_format: str = "logfmt"

    @property
    def output_file(self) -> Path | None:
        """The file to write the profile to, if any."""
        return None if self.output in {None, STDOUT} else self.output

    @property
    def output_format(self) -> Format:
        """The output file's format, by its name (JSON on standard output)."""
        file = self.output_file
        return (format_for(file.name) if file is not None else None) or "json"

    @property
    def to_stdout(self) -> bool:
        """Print the profile (JSON): asked for with `--output -`, the default without
        --configmap."""
        return self.output == STDOUT or (self.output is None and self.configmap is None)


def parse_device(value: object) -> str:
    device = text(value).strip().lower()
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"{quote(text(value))} is not auto, cpu, cuda or cuda:N")
    return device


def parse_output(value: object) -> Path:
    path = parse_path(value)
    if path == STDOUT:
        return path
    if format_for(path.name) is None:
        raise ValueError(f"{quote(str(path), PATH_QUOTE_LIMIT)} must end in .json, .yaml or .yml")
    if not path.parent.is_dir():
        raise ValueError(f"directory {quote(str(path.parent), PATH_QUOTE_LIMIT)} does not exist")
    return path


def parse_configmap(value: object) -> tuple[str, str]:
    spelled = text(value).strip()
    namespace, _, name = spelled.partition("/")
    if not _NAMESPACE.fullmatch(namespace) or not _NAME.fullmatch(name):
        raise ValueError(f"{quote(spelled)} is not NAMESPACE/NAME (lower-case DNS names)")
    return namespace, name


SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "device",
        "device",
        parse_device,
        "Where to measure: auto (the first GPU torch sees, else the CPU), cpu, cuda or cuda:N.",
        "DEVICE",
    ),
    Setting(
        "quick",
        "quick",
        parse_bool,
        "A short run: one size per measurement, three short trials.",
        "BOOL",
        switch=True,
    ),
    Setting(
        "output",
        "output",
        parse_output,
        "Write the profile to FILE (.json, .yaml or .yml), or - for standard output (the "
        "default without --configmap).",
        "FILE",
    ),
    Setting(
        "configmap",
        "configmap",
        parse_configmap,
        "Merge the profile into this ConfigMap under the model's key (nvidia-h100-80gb-hbm3.json): "
        "created if missing, other models' keys kept, retried on conflict.",
        "NAMESPACE/NAME",
    ),
    Setting(
        "kubeconfig",
        "kubeconfig",
        parse_file,
        "kubeconfig for --configmap (default: in-cluster, else $KUBECONFIG).",
        "FILE",
    ),
    Setting(
        "catalog.file",
        "catalog_file",
        parse_file,
        "A GPU catalog laid over the built-in one, for the datasheet figures in the profile.",
        "FILE",
    ),
    Setting(
        "config.file",
        "config_file",
        parse_path,
        "YAML file with any of these settings, nested at the dots (log: {level: debug}).",
        "FILE",
        flag_only=True,
    ),
    Setting(
        "log.level", "log_level", one_of("debug", "info", "warn", "error"), "Log level.", "LEVEL"
    ),
    Setting("log.format", "log_format", one_of("logfmt", "json"), "Log format.", "FORMAT"),
)

CALIBRATE: Final = SettingsTable(SETTINGS, CalibrateOptions(), env_prefix=ENV_PREFIX)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every setting as a flag. Values stay raw until `parse` checks them."""
    CALIBRATE.add_arguments(parser)


def parse(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> CalibrateOptions:
    """The options from parsed flags, the environment and `--config.file`; raises `OptionError`
    naming the first bad one."""
    return CalibrateOptions(**CALIBRATE.load(vars(args), environ))


def settings_table() -> str:
    """The calibration guide's flag table of `gpuscope calibrate`."""
    return CALIBRATE.table()
