"""The daemon's configuration: one typed, frozen object, parsed once at start.

Every setting of `gpuscope serve` is declared once in `SETTINGS` (the machinery is
`exporter.settings`, shared with `gpuscope rightsize` and `gpuscope calibrate`). From that one
table come the command-line flag (`--collect.interval`), the environment variable
(`GPUSCOPE_COLLECT_INTERVAL`), the key in the optional YAML file (`collect: {interval: 1s}`) and
the docs' flag table. Precedence is flag > environment > file > default. Anything wrong stops
the program with one line naming the setting (exit status 2, see `exporter.cli`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from exporter.dcgm_counters import DCGM_VERSIONS, CountersFile, read_counters, version_mismatch
from exporter.documents import quote
from exporter.settings import (
    PATH_QUOTE_LIMIT,
    ConfigError,
    ListenAddress,
    Setting,
    SettingsTable,
    count_between,
    duration_between,
    listen_address,
    one_of,
    parse_bool,
    parse_carbon_intensity,
    parse_existing_path,
    parse_file,
    parse_path,
    parse_safe_regex,
    text,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

__all__ = ["COLLECTORS", "SETTINGS", "ConfigError", "ListenAddress", "ServeConfig", "load"]


DRA_DRIVERS: Final = ("gpu.nvidia.com",)
"""The DRA drivers read by default: NVIDIA's GPU driver (whole GPUs and MIG devices)."""


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
    dra_drivers: tuple[str, ...] = DRA_DRIVERS
    """DRA drivers whose ResourceSlices and claims are read; empty turns DRA off."""
    pod_labels: re.Pattern[str] | None = None
    """Pod label names (full match) exported on gpu_pod_info; None exports none."""
    image_pattern: re.Pattern[str] | None = None
    """Container images (full match) exported on gpu_pod_container_info; None exports all."""
    carbon_intensity: float | None = None
    """The grid's carbon intensity, gCO2e/kWh; None: the catalog's, if it gives one."""
    web_config_file: Path | None = None
    max_requests: int = 40
    """Concurrent requests served at once (health probes aside); 0 means no limit."""
    enable_trace: bool = False
    """Serve the on-demand GPU trace at /debug/gpu-trace (`exporter.trace`)."""
    compat_dcgm: bool = False
    """Also serve dcgm-exporter's series (`exporter.metrics.dcgm`)."""
    dcgm_counters: CountersFile | None = None
    """The DCGM fields to serve, from dcgm-exporter's counters file; None: its default set."""
    dcgm_version: str = "4.8"
    """Whose names, units and labels `--compat.dcgm` serves: dcgm-exporter 4.8's or 4.9's."""
    collector_device: bool = True
    collector_clocks: bool = True
    collector_health: bool = True
    collector_processes: bool = False
    collector_gpm: bool = True
    collector_mig: bool = True
    collector_pcie: bool = True
    collector_nvlink: bool = False
    collector_events: bool = True
    collector_attribution: bool = True
    process_names: bool = False
    """Label per-process series with the process's name (`--collect.process-names`)."""
    node_condition: bool = False
    """Keep the `GPUHealthy` condition on this node (`exporter.actions.condition`)."""
    node_condition_recovery: float = 300.0
    """How long every GPU must answer, with no fatal XID, before `GPUHealthy` is True again."""
    events: bool = False
    """Post `GPUXidError` and `GPUIdle` Events on pods (`exporter.actions.events`)."""
    events_idle_after: float = 3600.0
    """How long a pod holds a GPU with zero busy time before a `GPUIdle` Event."""

    @property
    def collectors(self) -> frozenset[str]:
        """The collectors switched on (`--[no-]collector.<name>`)."""
        return frozenset(name for name, _ in COLLECTORS if getattr(self, f"collector_{name}"))


def parse_telemetry_path(value: object) -> str:
    path = text(value).strip()
    if not path.startswith("/") or path == "/" or path.startswith("/-/"):
        raise ValueError(f"{quote(path)} must be an absolute path other than / and /-/...")
    if any(char.isspace() or char in "?#" for char in path):
        raise ValueError(f"{quote(path)} must not contain spaces, ? or #")
    return path


def parse_simulate(value: object) -> str:
    spelled = text(value).strip()
    if spelled.isascii() and spelled.isdigit():
        if len(spelled) > 2 or not 1 <= int(spelled) <= 64:
            raise ValueError(f"{quote(spelled)} GPUs: simulate between 1 and 64")
        return spelled
    if not spelled or "\x00" in spelled or not Path(spelled).is_file():
        raise ValueError(
            f"{quote(spelled, PATH_QUOTE_LIMIT)} is neither a GPU count nor a readable fleet file"
        )
    return spelled


_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DOMAIN = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_RESOURCE_NAME = re.compile(
    rf"{_DOMAIN}/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?|{_DOMAIN}/([A-Za-z0-9][-A-Za-z0-9_.]*)?\*"
)
"""An extended resource name (example.com/gpu), or a prefix of one ending in * (example.com/gpu-*)."""
_MAX_RESOURCE_NAMES: Final = 64


def parse_node_name(value: object) -> str:
    spelled = text(value).strip()
    if not _NODE_NAME.fullmatch(spelled):
        raise ValueError(f"{quote(spelled)} is not a Kubernetes node name")
    return spelled


def parse_dcgm_counters(value: object) -> CountersFile:
    return read_counters(parse_file(value))


def parse_resource_names(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else text(value).split(",")
    if len(items) > _MAX_RESOURCE_NAMES:
        raise ValueError(f"more than {_MAX_RESOURCE_NAMES} names")
    names = tuple(spelled for item in items if (spelled := text(item).strip()))
    for name in names:
        if len(name) > 317 or not _RESOURCE_NAME.fullmatch(name):
            raise ValueError(
                f"{quote(name)} is not a resource name like example.com/gpu "
                "(a trailing * matches a prefix)"
            )
    return names


_MAX_DRA_DRIVERS: Final = 16


def parse_dra_drivers(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else text(value).split(",")
    if len(items) > _MAX_DRA_DRIVERS:
        raise ValueError(f"more than {_MAX_DRA_DRIVERS} drivers")
    names = tuple(dict.fromkeys(spelled for item in items if (spelled := text(item).strip())))
    for name in names:
        if len(name) > 63 or not _NODE_NAME.fullmatch(name):  # the API caps driver names at 63
            raise ValueError(f"{quote(name)} is not a DRA driver name like gpu.nvidia.com")
    return names


_DEFAULTS: Final = ServeConfig()

COLLECTORS: Final = (
    (
        "device",
        (
            "utilization, memory, power and its limits, energy, temperatures, fans, P-state, "
            "video engines, compute and persistence modes"
        ),
    ),
    ("clocks", "current and maximum clocks, clock-event (throttle) reasons"),
    ("health", "ECC errors, PCIe replays, throttle time, remapped rows, retired pages"),
    (
        "processes",
        "per-process series (pid label); process lists are still read for pod attribution",
    ),
    ("gpm", "GPM profiling activity and NVLink throughput (Hopper and newer)"),
    ("mig", "MIG mode and MIG instances as devices of their own"),
    ("pcie", "PCIe throughput, link generation and width"),
    ("nvlink", "per-link NVLink traffic and error counters (GPUs with NVLink)"),
    ("events", "the thread waiting for XID and ECC events"),
    ("attribution", "pods, allocations and workloads (with a Kubernetes cluster)"),
)
"""Every collector a user can switch, and what it reads (on by default but `OFF_BY_DEFAULT`)."""

OFF_BY_DEFAULT: Final = frozenset({"processes", "nvlink"})
"""Collectors whose series would take a default node past `BUDGET_SERIES`: NVLink's per-link
series (an 8-H100 node: 864 of them, 18 links x 6 counters per GPU), and per-process series
(2 per process, new ones with every pid: on a Kubernetes node the per-pod series say the same
per container). `benchmarks/series.py` measures what each collector adds."""

BUDGET_SERIES: Final = 1_500
"""Series one default node may serve: 8 GPUs, 64 processes and 200 pods on it, 64 of them using
GPUs (`benchmarks/series.py`); what a 1,000-node fleet pays per node in its metrics store."""

PROFILES: Final = {
    "lean": ("--no-collector.pcie",),
    "default": (),
    "full": ("--collector.processes", "--collector.nvlink"),
}
"""The chart's `daemon.profile` values and the flags each adds. `lean`: what the cluster and
workload dashboards, the alerts and `gpuscope rightsize` read, nothing else; `full`: every
collector (dcgm-exporter's series stay `compat.dcgm`'s choice)."""

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "web.listen-address",
        "listen_address",
        listen_address(9455),
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
        "kubernetes.dra-drivers",
        "dra_drivers",
        parse_dra_drivers,
        "DRA drivers whose devices are read as allocations, comma-separated: their ResourceSlices "
        "name the GPU behind each device a ResourceClaim holds. Empty turns DRA off.",
        "NAMES",
    ),
    Setting(
        "kubernetes.pod-labels",
        "pod_labels",
        parse_safe_regex,
        "Regular expression: pod labels whose names match it in full are exported on gpu_pod_info "
        "as label_<name> (none by default).",
        "REGEX",
    ),
    Setting(
        "kubernetes.image-pattern",
        "image_pattern",
        parse_safe_regex,
        "Regular expression: container images (digest dropped, cut to 128 characters) that match "
        'it in full are exported on gpu_pod_container_info; others show image="" (default: '
        "every image).",
        "REGEX",
    ),
    Setting(
        "carbon.intensity",
        "carbon_intensity",
        parse_carbon_intensity,
        "The electricity grid's carbon intensity in gCO2e/kWh (0 to 10000), exported as "
        "gpuscope_grid_carbon_intensity_grams_per_kwh; overrides the catalog's "
        "carbon_intensity_grams_per_kwh (default: the catalog's, else none).",
        "GRAMS",
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
    Setting(
        "web.enable-trace",
        "enable_trace",
        parse_bool,
        "Serve GET /debug/gpu-trace?seconds=N (and gpu=INDEX or UUID): N seconds (1 to 60) of each GPU's "
        "utilization, memory, power and SM clock at 10 Hz or more, and its pods' utilization, as "
        "a Chrome/Perfetto trace (JSON), behind the same TLS and auth as the metrics.",
        "BOOL",
        switch=True,
    ),
    Setting(
        "compat.dcgm",
        "compat_dcgm",
        parse_bool,
        "Also serve dcgm-exporter's series (DCGM_FI_*, with its names, units and labels) beside "
        "gpuscope's own, per pod on shared GPUs: see the README, Coming from dcgm-exporter.",
        "BOOL",
        switch=True,
    ),
    Setting(
        "compat.dcgm-counters",
        "dcgm_counters",
        parse_dcgm_counters,
        "dcgm-exporter's counters file (CSV: DCGM field, type, help): serve only the fields it "
        "lists (default: dcgm-exporter's default set). Needs --compat.dcgm.",
        "FILE",
    ),
    Setting(
        "compat.dcgm-version",
        "dcgm_version",
        one_of(*DCGM_VERSIONS),
        "The dcgm-exporter whose series --compat.dcgm serves: 4.8 (4.8.0-4.8.4 names, Hostname) "
        "or 4.9 (4.9.0's renamed fields in base units, hostname, DCGM_FI_SYSTEM_DRIVER_VERSION). "
        "A counters file must spell that version's names.",
        "VERSION",
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
    Setting(
        "collect.process-names",
        "process_names",
        parse_bool,
        "Label the per-process series with each process's name as the driver gives it "
        "(process_name). Off by default: every distinct name is a series of its own, and a "
        "name (an executable's path) can say more than the metrics' readers should see.",
        "BOOL",
        switch=True,
    ),
    Setting(
        "kubernetes.node-condition",
        "node_condition",
        parse_bool,
        "Keep a GPUHealthy condition on this node (PATCH of its nodes/NAME/status only): False "
        "within seconds of a fatal XID (79, 48, 94, 95) or a lost GPU, True again after the "
        "recovery period. Needs a cluster and RBAC get and patch on nodes/status.",
        "BOOL",
        switch=True,
        file_key="kubernetes.node-condition.enabled",
    ),
    Setting(
        "kubernetes.node-condition.recovery",
        "node_condition_recovery",
        duration_between(1.0, 7 * 86400.0),
        "How long every GPU must answer, with no fatal XID, before GPUHealthy is True again "
        "(1s to 7d). Needs --kubernetes.node-condition.",
        "DURATION",
    ),
    Setting(
        "kubernetes.events",
        "events",
        parse_bool,
        "Post Events (events.k8s.io/v1) on the pods that matter: GPUXidError on every pod "
        "holding or using a GPU hit by a fatal XID, GPUIdle on a pod holding a GPU with zero "
        "busy time. Needs a cluster and RBAC create and patch on events.",
        "BOOL",
        switch=True,
        file_key="kubernetes.events.enabled",
    ),
    Setting(
        "kubernetes.events.idle-after",
        "events_idle_after",
        duration_between(1.0, 30 * 86400.0),
        "How long a pod holds a GPU with zero busy time before a GPUIdle Event, and the least "
        "time between two of them on one pod (1s to 30d). Needs --kubernetes.events.",
        "DURATION",
    ),
)


SERVE: Final = SettingsTable(SETTINGS, _DEFAULTS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare every setting as a flag. Values stay raw strings until `load` parses them."""
    SERVE.add_arguments(parser)


def load(flags: Mapping[str, object], environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Build the config from parsed flags (keyed by attribute), the environment and the YAML file."""
    config = ServeConfig(**SERVE.load(flags, environ))
    if config.dcgm_counters is not None and not config.compat_dcgm:
        raise ConfigError(
            "--compat.dcgm-counters", "it chooses what --compat.dcgm serves, and that is off"
        )
    if config.dcgm_version != _DEFAULTS.dcgm_version and not config.compat_dcgm:
        raise ConfigError(
            "--compat.dcgm-version", "it chooses what --compat.dcgm serves, and that is off"
        )
    if config.dcgm_counters is not None:
        mismatch = version_mismatch(config.dcgm_counters, config.dcgm_version)
        if mismatch is not None:
            raise ConfigError("--compat.dcgm-counters", mismatch)
    for switch, sub, tuned in (
        ("node_condition", "node_condition_recovery", "--kubernetes.node-condition.recovery"),
        ("events", "events_idle_after", "--kubernetes.events.idle-after"),
    ):
        if getattr(config, sub) != getattr(_DEFAULTS, sub) and not getattr(config, switch):
            switch_flag = "--kubernetes." + switch.replace("node_", "node-")
            raise ConfigError(tuned, f"it tunes {switch_flag}, and that is off")
    if config.node_condition and not config.collector_events:
        raise ConfigError(
            "--kubernetes.node-condition",
            "fatal XIDs come from the events collector, and --no-collector.events turns it off",
        )
    if config.events and not config.collector_attribution:
        raise ConfigError(
            "--kubernetes.events",
            "Events go on pods, and --no-collector.attribution turns pods off",
        )
    if config.process_names and not config.collector_processes:
        raise ConfigError(
            "--collect.process-names",
            "it labels the per-process series, and --collector.processes is off (the default)",
        )
    return config


def settings_table() -> str:
    """The docs' flag table of `gpuscope serve` (scripts/reference.py)."""
    return SERVE.table()


def collectors_table() -> str:
    """The Markdown table of collectors for the docs."""
    rows = ["| collector | reads | by default | switch with |", "|---|---|---|---|"]
    rows.extend(
        f"| `{name}` | {what} | off | `--collector.{name}` |"
        if name in OFF_BY_DEFAULT
        else f"| `{name}` | {what} | on | `--no-collector.{name}` |"
        for name, what in COLLECTORS
    )
    return "\n".join(rows)


def profiles_table() -> str:
    """The Markdown table of the chart's collector profiles for the docs."""
    rows = ["| `daemon.profile` | flags it adds |", "|---|---|"]
    rows.extend(
        f"| `{name}` | {', '.join(f'`{flag}`' for flag in flags) or 'none: the defaults'} |"
        for name, flags in PROFILES.items()
    )
    return "\n".join(rows)
