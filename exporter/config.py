"""The daemon's configuration: one typed, frozen object, parsed once at start.

Every setting is declared once in `SETTINGS`. From that one table come the command-line flag
(`--collect.interval`), the environment variable (`GPUSCOPE_COLLECT_INTERVAL`), the key in the
optional YAML file (`collect: {interval: 1s}`) and the README's flag table. Precedence is
flag > environment > file > default. Anything wrong stops the program with one line naming the
setting (exit status 2, see `exporter.cli`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from exporter.durations import format_duration, parse_duration_between

ENV_PREFIX: Final = "GPUSCOPE_"


class ConfigError(Exception):
    """A setting that cannot be used. `str()` is a complete one-line explanation."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"invalid {setting}: {problem}")
        self.setting = setting


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """Where the HTTP server listens; `host` None means every interface."""

    host: str | None
    port: int

    def __str__(self) -> str:
        host = self.host or ""
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Settings of `gpuscope serve`. Field docs are the flags' help texts (see SETTINGS)."""

    listen_address: ListenAddress = field(default_factory=lambda: ListenAddress(None, 9455))
    telemetry_path: str = "/metrics"
    collect_interval: float = 1.0
    simulate: str | None = None
    log_level: str = "info"
    log_format: str = "logfmt"
    config_file: Path | None = None
    calibration_path: Path | None = None
    catalog_file: Path | None = None
    procfs: Path = Path("/proc")
    node_name: str | None = None
    kubeconfig: Path | None = None
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    resource_names: tuple[str, ...] | None = None
    """Device-plugin resource names read beside nvidia.com/gpu and nvidia.com/mig-*."""
    pod_labels: re.Pattern[str] | None = None
    """Pod label names (full match) exported on gpu_pod_info; None exports none."""
    web_config_file: Path | None = None
    max_requests: int = 40
    """Concurrent requests served at once (health probes aside); 0 means no limit."""
    collector_device: bool = True
    collector_clocks: bool = True
    collector_health: bool = True
    collector_processes: bool = True
    collector_gpm: bool = True
    collector_mig: bool = True
    collector_pcie: bool = True
    collector_events: bool = True
    collector_attribution: bool = True

    @property
    def collectors(self) -> frozenset[str]:
        """The collectors switched on (`--[no-]collector.<name>`)."""
        return frozenset(name for name, _ in COLLECTORS if getattr(self, f"collector_{name}"))


# -- value parsers: each takes what a flag, variable or YAML file holds, returns the typed value or
# raises ValueError with a message that completes "invalid --x: ...".


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return str(value)


def parse_listen_address(value: object) -> ListenAddress:
    text = _text(value).strip()
    match = re.fullmatch(
        r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\[\]:]*)):(?P<port>\d{1,5})", text
    )
    if match is None:
        raise ValueError(f"{text!r} is not host:port (e.g. :9455, 127.0.0.1:9455, [::1]:9455)")
    port = int(match["port"])
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0-65535")
    host = match["v6"] or match["host"] or None
    return ListenAddress(host, port)


def parse_telemetry_path(value: object) -> str:
    path = _text(value).strip()
    if not path.startswith("/") or path == "/" or path.startswith("/-/"):
        raise ValueError(f"{path!r} must be an absolute path other than / and /-/...")
    if any(char.isspace() or char in "?#" for char in path):
        raise ValueError(f"{path!r} must not contain spaces, ? or #")
    return path


def duration_between(low: float, high: float) -> Callable[[object], float]:
    def parse(value: object) -> float:
        return parse_duration_between(_text(value), low, high)

    return parse


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = _text(value).strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off"}:
        return False
    raise ValueError(f"{text!r} is not a boolean (true or false)")


def one_of(*choices: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        text = _text(value).strip().lower()
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    return parse


def parse_simulate(value: object) -> str:
    text = _text(value).strip()
    if text.isdigit():
        if not 1 <= int(text) <= 64:
            raise ValueError(f"{text} GPUs: simulate between 1 and 64")
        return text
    if not Path(text).is_file():
        raise ValueError(f"{text!r} is neither a GPU count nor a readable fleet file")
    return text


def parse_path(value: object) -> Path:
    return Path(_text(value))


def parse_existing_path(value: object) -> Path:
    path = Path(_text(value))
    if not path.exists():
        raise ValueError(f"{str(path)!r}: no such file or directory")
    return path


def parse_file(value: object) -> Path:
    path = Path(_text(value))
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a readable file")
    return path


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DOMAIN = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_RESOURCE_NAME = re.compile(
    rf"{_DOMAIN}/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?|{_DOMAIN}/([A-Za-z0-9][-A-Za-z0-9_.]*)?\*"
)
"""An extended resource name (example.com/gpu), or a prefix of one ending in * (example.com/gpu-*)."""


def parse_node_name(value: object) -> str:
    text = _text(value).strip()
    if not _NODE_NAME.fullmatch(text):
        raise ValueError(f"{text!r} is not a Kubernetes node name")
    return text


def parse_resource_names(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else _text(value).split(",")
    names = tuple(_text(item).strip() for item in items if _text(item).strip())
    for name in names:
        if not _RESOURCE_NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a resource name like example.com/gpu (a trailing * matches a prefix)"
            )
    return names


def parse_regex(value: object) -> re.Pattern[str]:
    text = _text(value)
    try:
        return re.compile(text)
    except re.error as error:
        raise ValueError(f"{text!r} is not a regular expression: {error}") from error


def count_between(low: int, high: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        text = _text(value).strip()
        if not text.isascii() or not text.isdigit():
            raise ValueError(f"{text!r} is not a whole number")
        number = int(text)
        if not low <= number <= high:
            raise ValueError(f"{number} is outside {low}..{high}")
        return number

    return parse


@dataclass(frozen=True, slots=True)
class Setting:
    """One configurable value: its dotted name, where it lands, how it is read, its help."""

    name: str
    attribute: str
    parse: Callable[[object], Any]
    help: str
    metavar: str = "VALUE"
    flag_only: bool = False
    fallback_env: str | None = None
    """A variable outside the GPUSCOPE_ namespace that, when set, replaces the default."""
    switch: bool = False
    """A boolean given as `--name` / `--no-name` on the command line (node_exporter's style)."""

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return ENV_PREFIX + re.sub(r"[.-]", "_", self.name).upper()


_DEFAULTS: Final = ServeConfig()

COLLECTORS: Final = (
    ("device", "utilization, memory, power, energy, temperature, fans, P-state"),
    ("clocks", "current and maximum clocks, clock-event (throttle) reasons"),
    ("health", "ECC errors, PCIe replays, throttle time, remapped rows, retired pages"),
    (
        "processes",
        "per-process series (pid label); process lists are still read for pod attribution",
    ),
    ("gpm", "GPM profiling activity and NVLink throughput (Hopper and newer)"),
    ("mig", "MIG mode and MIG instances as devices of their own"),
    ("pcie", "PCIe throughput"),
    ("events", "the thread waiting for XID and ECC events"),
    ("attribution", "pods, allocations and workloads (with a Kubernetes cluster)"),
)
"""Every collector a user can switch, and what it reads (all on by default)."""

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "web.listen-address",
        "listen_address",
        parse_listen_address,
        "Address to listen on for HTTP requests.",
        "HOST:PORT",
    ),
    Setting(
        "web.telemetry-path",
        "telemetry_path",
        parse_telemetry_path,
        "Path under which metrics are served.",
        "PATH",
    ),
    Setting(
        "collect.interval",
        "collect_interval",
        duration_between(0.1, 600.0),
        "How often to sample every GPU (100ms to 10m).",
        "DURATION",
    ),
    Setting(
        "simulate",
        "simulate",
        parse_simulate,
        "Run without a GPU: simulate N GPUs of the default model, or the fleet in a YAML FILE.",
        "N|FILE",
    ),
    Setting(
        "log.level", "log_level", one_of("debug", "info", "warn", "error"), "Log level.", "LEVEL"
    ),
    Setting("log.format", "log_format", one_of("logfmt", "json"), "Log format.", "FORMAT"),
    Setting(
        "config.file",
        "config_file",
        parse_path,
        "YAML file with any of these settings, nested at the dots (collect: {interval: 1s}).",
        "FILE",
        flag_only=True,
    ),
    Setting(
        "calibration.path",
        "calibration_path",
        parse_existing_path,
        "Calibration profiles (from gpuscope calibrate) to export as gpu_calibrated_* series: a "
        "profile file or a directory of them, such as the mounted ConfigMap; re-read when it changes.",
        "PATH",
    ),
    Setting(
        "catalog.file",
        "catalog_file",
        parse_file,
        "A GPU catalog in the built-in one's format, laid over it: datasheet peaks and prices "
        "(gpu_datasheet_*, gpu_price_usd_per_hour).",
        "FILE",
    ),
    Setting(
        "path.procfs",
        "procfs",
        parse_path,
        "Where the host's /proc is mounted (/host/proc in the DaemonSet): GPU processes' cgroups "
        "are read there.",
        "PATH",
    ),
    Setting(
        "kubernetes.node-name",
        "node_name",
        parse_node_name,
        "This node's name: only its pods are watched (default: $NODE_NAME, which the DaemonSet "
        "sets from spec.nodeName).",
        "NAME",
        fallback_env="NODE_NAME",
    ),
    Setting(
        "kubeconfig",
        "kubeconfig",
        parse_path,
        "kubeconfig file, to run outside a cluster (default: the in-cluster service account, else "
        "$KUBECONFIG if set; with neither, pod attribution is off).",
        "FILE",
    ),
    Setting(
        "kubelet.pod-resources-socket",
        "pod_resources_socket",
        parse_path,
        "The kubelet's PodResources API socket: which container was given which GPU.",
        "PATH",
    ),
    Setting(
        "kubelet.resource-names",
        "resource_names",
        parse_resource_names,
        "Extra device-plugin resource names to read allocations of, comma-separated; "
        "nvidia.com/gpu and nvidia.com/mig-* are always read. A trailing * matches a prefix.",
        "NAMES",
    ),
    Setting(
        "kubernetes.pod-labels",
        "pod_labels",
        parse_regex,
        "Regular expression: pod labels whose names match it in full are exported on gpu_pod_info "
        "as label_<name> (none by default).",
        "REGEX",
    ),
    Setting(
        "web.config.file",
        "web_config_file",
        parse_file,
        "Web config in Prometheus's exporter-toolkit format: TLS, client certificates, basic auth "
        "(bcrypt hashes), response headers, a rate limit. Re-read when it or a file it names "
        "changes, and on SIGHUP; a bad version is logged and the previous one kept.",
        "FILE",
    ),
    Setting(
        "web.max-requests",
        "max_requests",
        count_between(0, 100_000),
        "Maximum number of requests served at once (health probes aside); more get 503. "
        "0 means no limit.",
        "N",
    ),
    *(
        Setting(
            f"collector.{name}",
            f"collector_{name}",
            parse_bool,
            f"Collector {name}: {what}.",
            "BOOL",
            switch=True,
        )
        for name, what in COLLECTORS
    ),
    Setting(
        "collect.processes",
        "collector_processes",
        parse_bool,
        "The same as --[no-]collector.processes (the name of earlier releases).",
        "BOOL",
    ),
)


def default_value(setting: Setting) -> object:
    return getattr(_DEFAULTS, setting.attribute)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every setting as a flag. Values stay raw strings until `load` parses them."""
    for setting in SETTINGS:
        default = default_value(setting)
        shown = "" if default is None else f" (default: {_describe(default)})"
        if setting.switch:
            parser.add_argument(
                setting.flag,
                dest=setting.attribute,
                nargs="?",
                const="true",
                metavar=setting.metavar,
                default=argparse.SUPPRESS,
                help=f"{setting.help}{shown} [env {setting.env}]",
            )
            parser.add_argument(
                f"--no-{setting.name}",
                dest=setting.attribute,
                action="store_const",
                const="false",
                default=argparse.SUPPRESS,
                help=f"Switch the {setting.name.removeprefix('collector.')} collector off.",
            )
            continue
        parser.add_argument(
            setting.flag,
            dest=setting.attribute,
            metavar=setting.metavar,
            default=argparse.SUPPRESS,
            help=f"{setting.help}{shown} [env {setting.env}]",
        )


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format_duration(value)
    return str(value)


def load(flags: Mapping[str, object], environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Build the config from parsed flags (keyed by attribute), the environment and the YAML file."""
    environ = os.environ if environ is None else environ
    by_attribute = {setting.attribute: setting for setting in SETTINGS}
    from_env = {s.attribute: (s, s.env, environ[s.env]) for s in SETTINGS if s.env in environ}
    from_flags = {a: (by_attribute[a], by_attribute[a].flag, value) for a, value in flags.items()}

    sources: dict[str, tuple[Setting, str, object]] = {
        s.attribute: (s, s.fallback_env, environ[s.fallback_env])
        for s in SETTINGS
        if s.fallback_env is not None and environ.get(s.fallback_env)
    }
    config_file = from_flags.get("config_file") or from_env.get("config_file")
    if config_file is not None:
        for setting, value in _read_file(_parse(*config_file)).items():
            sources[setting.attribute] = (setting, f"{setting.name} in the config file", value)
    sources.update(from_env)
    sources.update(from_flags)
    return ServeConfig(**{attribute: _parse(*source) for attribute, source in sources.items()})


def _parse(setting: Setting, source: str, value: object) -> Any:
    try:
        return setting.parse(value)
    except ValueError as error:
        raise ConfigError(source, str(error)) from error


def _read_file(path: Path) -> dict[Setting, object]:
    where = f"--config.file {path}"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(where, error.strerror or str(error)) from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(where, f"not valid YAML{line}") from error
    except RecursionError as error:  # found by tests/test_fuzz.py
        raise ConfigError(where, "nested too deeply") from error
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(where, "the top level must be a mapping of settings")
    by_name = {setting.name: setting for setting in SETTINGS if not setting.flag_only}
    found: dict[Setting, object] = {}
    for name, value in _flatten(document, where):
        if name not in by_name:
            raise ConfigError(where, f"unknown setting {name!r}")
        found[by_name[name]] = value
    return found


def _flatten(document: Mapping[Any, Any], where: str, prefix: str = "") -> list[tuple[str, object]]:
    items: list[tuple[str, object]] = []
    for key, value in document.items():
        if not isinstance(key, str):
            raise ConfigError(where, f"setting names must be strings, got {key!r}")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items.extend(_flatten(value, where, f"{name}."))
        else:
            items.append((name, value))
    return items


def settings_table(settings: Sequence[Setting] = SETTINGS) -> str:
    """The Markdown flag table for the README (a test keeps the README equal to it)."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for setting in settings:
        default = default_value(setting)
        shown = "" if default is None else f"`{_describe(default)}`"
        flag = f"--[no-]{setting.name}" if setting.switch else setting.flag
        rows.append(f"| `{flag}` | `{setting.env}` | {shown} | {setting.help} |")
    return "\n".join(rows)


def collectors_table() -> str:
    """The Markdown table of collectors for the README."""
    rows = ["| collector | reads | switch off with |", "|---|---|---|"]
    rows.extend(f"| `{name}` | {what} | `--no-collector.{name}` |" for name, what in COLLECTORS)
    return "\n".join(rows)
