"""`gpuscope rightsize`'s settings, declared once, and the run's configuration built from them.

Every setting is a row of `SETTINGS` (the machinery is `exporter.settings`, shared with `serve`
and `calibrate`): the flag (`--window`), the variable (`GPUSCOPE_RIGHTSIZE_WINDOW`), the key of
the optional `--config.file` YAML (`prometheus: {url: http://prometheus:9090, timeout: 1m}`),
`--help` and the README's table come from it. Precedence is flag > environment > file > default.
`configure` then reads the files the settings name (secrets, CA certificates, catalog, prices,
each bounded) and checks what no single setting can (`--window` against `--step`, a password
without a user): everything wrong is one line and exit status 2 before any query is sent.

`gpuscope rightsize serve` has a table of its own (`RIGHTSIZE_SERVE`): the same rows but the
output's (`--format`, `--output`, `--configmap`), and the server's (`SERVER_SETTINGS`:
`--web.listen-address`, `--web.config.file`, `--web.max-requests`, `--refresh`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Final

from exporter import logs
from exporter.catalog import Catalog, CatalogError, builtin_catalog, load_catalog
from exporter.documents import quote, size_text
from exporter.durations import format_duration
from exporter.rightsize.confidence import LEVELS
from exporter.rightsize.connection import (
    CA_FILE_LIMIT,
    PASSWORD_ENV,
    SECRET_FILE_LIMIT,
    TOKEN_ENV,
    connection,
)
from exporter.rightsize.formatters import DIRECTORIES, FORMATTERS
from exporter.rightsize.hardware import PriceFileError, load_price_file
from exporter.rightsize.prometheus import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Connection,
)
from exporter.rightsize.replay.policies import parse_policies
from exporter.rightsize.selection import Selection
from exporter.rightsize.settings import STRATEGY_SETTINGS, StrategySettings
from exporter.rightsize.strategy import STRATEGIES
from exporter.rightsize.values import (
    MAX_CLOCK_SKEW_SECONDS,
    parse_cluster_label,
    parse_configmap,
    parse_end,
    parse_headers,
    parse_namespace_list,
    parse_output,
    parse_report_url,
    parse_selector_text,
    parse_url,
    parse_username,
    parse_webhooks,
    size_between,
)
from exporter.settings import (
    PATH_QUOTE_LIMIT,
    CommandParser,
    ConfigError,
    ListenAddress,
    Setting,
    SettingsTable,
    count_between,
    duration_between,
    listen_address,
    one_of,
    parse_bool,
    parse_file,
    parse_path,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from exporter.rightsize.configmap import ConfigMapTarget
    from exporter.rightsize.notify import Webhook
    from exporter.rightsize.selection import Requirement

PROG: Final = "gpuscope rightsize"
ENV_PREFIX: Final = "GPUSCOPE_RIGHTSIZE_"
DEFAULT_PORT: Final = 9456
"""The report server's port: the daemon's (9455) and one."""
SOURCES: Final = ("gpuscope", "dcgm-exporter", "auto")
"""`--source`: whose series the history is read from."""


@dataclass(frozen=True, slots=True)
class RightsizeSettings(StrategySettings):
    """Every setting of `gpuscope rightsize`, as given: the strategy's, and the job's own.
    Field docs are the flags' help texts (see SETTINGS)."""

    prometheus: str = ""
    window: float = 14 * 86400.0
    step: float = 300.0
    end: float | None = None
    """Unix seconds; None: now."""
    namespaces: tuple[str, ...] = ()
    selector: tuple[Requirement, ...] = ()
    token_file: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = 120.0
    connect_timeout: float = 10.0
    read_timeout: float = 15.0
    concurrency: int = 4
    max_response_size: int = DEFAULT_MAX_RESPONSE_BYTES
    strategy: str = "simple"
    prices_file: Path | None = None
    catalog_file: Path | None = None
    output_format: str = "table"
    output: Path | None = None
    configmap: ConfigMapTarget | None = None
    config_file: Path | None = None
    log_level: str = "info"
    log_format: str = "logfmt"
    cluster_label: str | None = None
    min_confidence: str = "low"
    notify: tuple[Webhook, ...] = ()
    notify_timeout: float = 10.0
    report_url: str | None = None
    source: str = "gpuscope"
    simulate: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServeSettings(RightsizeSettings):
    """`gpuscope rightsize serve`'s settings: the job's, and the server's."""

    listen_address: ListenAddress = field(default_factory=lambda: ListenAddress(None, DEFAULT_PORT))
    web_config_file: Path | None = None
    max_requests: int = 40
    refresh: float = 6 * 3600.0


@dataclass(frozen=True, slots=True)
class RightsizeConfig:
    """What a run needs, every file it names read and checked."""

    connection: Connection
    selection: Selection
    window: float
    step: float
    end: float
    strategy: str
    settings: StrategySettings
    output_format: str
    output: Path | None
    configmap: ConfigMapTarget | None
    catalog: Catalog
    prices: dict[str, float]
    log_level: str
    log_format: str
    cluster_label: str | None = None
    min_confidence: str = "low"
    notify: tuple[Webhook, ...] = ()
    notify_timeout: float = 10.0
    report_url: str | None = None
    fixed_end: bool = False
    """`--end` was given: every run (each of the server's refreshes) reports the same window."""
    source: str = "gpuscope"
    """Whose series the history is read from (`--source`)."""
    simulate: tuple[str, ...] = ()
    """Sharing policies to replay over the window (`exporter/rightsize/replay/`)."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """What `gpuscope rightsize serve` needs: a run's configuration and the server's."""

    run: RightsizeConfig
    listen_address: ListenAddress
    web_config_file: Path | None
    max_requests: int
    refresh: float


# -- the table ----------------------------------------------------------------------------------

_DEFAULTS: Final = RightsizeSettings()
_URL_HELP: Final = (
    "Base URL of the PromQL API: Prometheus (http://prometheus:9090), Thanos Query "
    "(http://thanos-query:10902), Mimir (https://mimir/prometheus), VictoriaMetrics."
)

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "config.file",
        "config_file",
        parse_path,
        "YAML file with any of these settings, nested at the dots "
        "(prometheus: {url: http://prometheus:9090, timeout: 1m}).",
        "FILE",
        flag_only=True,
    ),
    Setting(
        "prometheus.url",
        "prometheus",
        parse_url,
        "The same as --prometheus, so that a config file can nest it beside the other "
        "prometheus.* settings (prometheus: {url: ..., timeout: 1m}).",
        "URL",
        group="history",
    ),
    Setting(
        "prometheus", "prometheus", parse_url, _URL_HELP, "URL", required=True, group="history"
    ),
    Setting(
        "window",
        "window",
        duration_between(3600, 365 * 86400),
        "How far back to look (1h to 365d).",
        "DURATION",
        group="history",
    ),
    Setting(
        "step",
        "step",
        duration_between(10, 86400),
        "Resolution of the history: utilization is averaged per step (10s to 1d; at least twice "
        "the scrape interval; the window spans at least two).",
        "DURATION",
        group="history",
    ),
    Setting(
        "end",
        "end",
        parse_end,
        "End of the window, RFC 3339 or unix seconds, for reproducible reports; at most "
        f"{format_duration(MAX_CLOCK_SKEW_SECONDS)} ahead of this machine's clock.",
        "TIME",
        group="history",
        shown_default="now",
    ),
    Setting(
        "namespace",
        "namespaces",
        parse_namespace_list,
        "Only these namespaces (repeat or comma-separate).",
        "NS",
        repeated=True,
        group="history",
        shown_default="all",
    ),
    Setting(
        "selector",
        "selector",
        parse_selector_text,
        "Kubernetes label selector on pod labels (team=ml,tier in (batch)), matched against the "
        "label_* labels of gpu_pod_info (the daemon's --kubernetes.pod-labels must export them).",
        "SELECTOR",
        group="history",
    ),
    Setting(
        "cluster-label",
        "cluster_label",
        parse_cluster_label,
        "Label telling clusters apart when one store (Thanos, Mimir, VictoriaMetrics) holds "
        "many, e.g. cluster: workloads, money and consolidation are per cluster, and every "
        "report shows it.",
        "LABEL",
        group="history",
    ),
    Setting(
        "source",
        "source",
        one_of(*SOURCES),
        "Whose series the history is read from: gpuscope (its daemon's), dcgm-exporter "
        "(dcgm-exporter's and kube-state-metrics', 4.8 or 4.9 names: see what gpuscope would "
        "save before installing it; every recommendation at most of medium confidence), auto "
        "(gpuscope's where the window has them, else dcgm-exporter's; the choice is logged).",
        "SOURCE",
        group="history",
    ),
    Setting(
        "prometheus.bearer-token-file",
        "token_file",
        parse_file,
        f"Send this file's token as a bearer token (or set the token itself in {TOKEN_ENV}); "
        f"at most {size_text(SECRET_FILE_LIMIT)}.",
        "FILE",
        group="connection",
    ),
    Setting(
        "prometheus.username",
        "username",
        parse_username,
        f"Basic-auth user; the password comes from --prometheus.password-file or {PASSWORD_ENV}.",
        "USER",
        group="connection",
    ),
    Setting(
        "prometheus.password-file",
        "password_file",
        parse_file,
        f"Basic-auth password file (at most {size_text(SECRET_FILE_LIMIT)}).",
        "FILE",
        group="connection",
    ),
    Setting(
        "prometheus.ca-file",
        "ca_file",
        parse_file,
        "CA certificates (PEM) to verify the server's TLS certificate with "
        f"(at most {size_text(CA_FILE_LIMIT)}).",
        "FILE",
        group="connection",
    ),
    Setting(
        "prometheus.insecure-skip-verify",
        "insecure_skip_verify",
        parse_bool,
        "Do not verify the server's TLS certificate.",
        "BOOL",
        switch=True,
        group="connection",
    ),
    Setting(
        "prometheus.header",
        "headers",
        parse_headers,
        "Extra request header, e.g. 'X-Scope-OrgID: team-a' for Mimir or Cortex (repeatable; "
        "one per line in the variable).",
        "'NAME: VALUE'",
        repeated=True,
        separator="\n",
        group="connection",
    ),
    Setting(
        "prometheus.timeout",
        "timeout",
        duration_between(1, 3600),
        "Time limit of one query attempt (1s to 1h): a server that answers but is slow to "
        "evaluate a query gets this long.",
        "DURATION",
        group="connection",
    ),
    Setting(
        "prometheus.connect-timeout",
        "connect_timeout",
        duration_between(1, 300),
        "Time limit to open a connection, TCP and TLS (1s to 5m); retried as a refused "
        "connection is.",
        "DURATION",
        group="connection",
    ),
    Setting(
        "prometheus.read-timeout",
        "read_timeout",
        duration_between(1, 3600),
        "How long a query may go without an answer before the server is asked a trivial query "
        "(1s to 1h): when that has no answer within as long again, the server is not answering "
        "and the run fails at once; when it has, the query keeps --prometheus.timeout.",
        "DURATION",
        group="connection",
    ),
    Setting(
        "prometheus.concurrency",
        "concurrency",
        count_between(1, 32),
        "Queries in flight at once (1 to 32).",
        "N",
        group="connection",
    ),
    Setting(
        "prometheus.max-response-size",
        "max_response_size",
        size_between(1 << 20, 4 << 30),
        "Largest answer read from the PromQL API (1MiB to 4GiB): a longer one fails the query "
        "as soon as it passes the limit. No answer is built whole: one at the limit costs the "
        "job under 400 MiB whatever its shape; what the job keeps grows with the series asked "
        "for.",
        "SIZE",
        group="connection",
        shown_default=size_text(DEFAULT_MAX_RESPONSE_BYTES).replace(" ", ""),
    ),
    Setting(
        "strategy",
        "strategy",
        one_of(*sorted(STRATEGIES)),
        f"The strategy, registered by name: {', '.join(sorted(STRATEGIES))}.",
        "NAME",
        group="strategy",
    ),
    *STRATEGY_SETTINGS,
    Setting(
        "min-confidence",
        "min_confidence",
        one_of(*LEVELS),
        "Leave out recommendations less trusted than this: low (none left out), medium, high "
        "(see Confidence and terms).",
        "LEVEL",
        group="strategy",
    ),
    Setting(
        "simulate",
        "simulate",
        parse_policies,
        "Replay these sharing policies over every step of the window: current, exclusive, mig, "
        "timeslice, binpack (comma-separated): the GPUs, utilization, contention and cost each "
        "would have had, and its placement.",
        "POLICIES",
        repeated=True,
        group="strategy",
    ),
    Setting(
        "prices",
        "prices_file",
        parse_file,
        "YAML price file overriding the catalog's on-demand prices, per catalog key or NVML name: "
        'prices: {h100-sxm: 4.10, "NVIDIA L4": 0.62}.',
        "FILE",
        group="strategy",
    ),
    Setting(
        "catalog.file",
        "catalog_file",
        parse_file,
        "A GPU catalog replacing the built-in one.",
        "FILE",
        group="strategy",
    ),
    Setting(
        "format",
        "output_format",
        one_of(*FORMATTERS, *DIRECTORIES),
        "table (rich; colour on a terminal), json, yaml, csv, markdown, html (self-contained, "
        "inline SVG plots, sorting and filters), patches (a directory: a strategic-merge patch "
        "per workload to change, and apply.sh).",
        "FORMAT",
        group="output",
    ),
    Setting(
        "output",
        "output",
        parse_output,
        "Write the report to FILE instead of standard output (--format patches: to the "
        "directory DIR, created if need be).",
        "FILE",
        group="output",
        shown_default="standard output",
    ),
    Setting(
        "configmap",
        "configmap",
        parse_configmap,
        "Also keep the report in this ConfigMap under the key report.EXT (EXT: the format's "
        "extension: md, json, ...), created or replaced.",
        "NAMESPACE/NAME",
        group="output",
    ),
    Setting(
        "notify",
        "notify",
        parse_webhooks,
        "After a run, post a summary to this webhook (repeatable): a Slack incoming webhook "
        "(https://hooks.slack.com/...), Microsoft Teams (https://*.webhook.office.com/..., a "
        "workflow's https://*.logic.azure.com/...), or any URL as slack+https://..., "
        "teams+https://..., json+https://... (plain JSON). A URL is a secret: never logged.",
        "URL",
        repeated=True,
        group="notify",
    ),
    Setting(
        "notify-timeout",
        "notify_timeout",
        duration_between(1, 300),
        "Time limit of one post to a webhook (1s to 5m); a failed one is tried once more if "
        "worth it, and never fails the report.",
        "DURATION",
        group="notify",
    ),
    Setting(
        "report-url",
        "report_url",
        parse_report_url,
        "Where people find the report (the server's address, a wiki page): the notifications "
        "link to it.",
        "URL",
        group="notify",
    ),
    Setting(
        "log.level",
        "log_level",
        one_of(*logs.LEVELS),
        "Log level; logs go to standard error, the report alone to standard output.",
        "LEVEL",
        group="output",
    ),
    Setting(
        "log.format",
        "log_format",
        one_of("logfmt", "json"),
        "Log format.",
        "FORMAT",
        group="output",
    ),
)

RIGHTSIZE: Final = SettingsTable(SETTINGS, _DEFAULTS, env_prefix=ENV_PREFIX)

SERVER_SETTINGS: Final = (
    Setting(
        "web.listen-address",
        "listen_address",
        listen_address(DEFAULT_PORT),
        "Address to serve the report, its JSON and its metrics on (host:port, :port for every "
        "interface), as the daemon's flag.",
        "ADDRESS",
        group="server",
        shown_default=f":{DEFAULT_PORT}",
    ),
    Setting(
        "web.config.file",
        "web_config_file",
        parse_file,
        "Web config in Prometheus's exporter-toolkit format (TLS, client certificates, basic "
        "auth, headers, a rate limit), as the daemon's: re-read when it changes, and on SIGHUP.",
        "FILE",
        group="server",
    ),
    Setting(
        "web.max-requests",
        "max_requests",
        count_between(0, 100_000),
        "Requests served at once (health probes aside); more get 503. 0 means no limit.",
        "N",
        group="server",
    ),
    Setting(
        "refresh",
        "refresh",
        duration_between(60, 30 * 86400),
        "How often the report is made again (1m to 30d). A refresh that fails is logged and "
        "counted, the last report kept, and it is tried again sooner (from 30s, doubling).",
        "DURATION",
        group="server",
    ),
)
"""The server's own rows of `gpuscope rightsize serve`'s table."""
_SERVE_ONLY_OUTPUT: Final = frozenset({"output_format", "output", "configmap"})
RIGHTSIZE_SERVE: Final = SettingsTable(
    (
        *(setting for setting in SETTINGS if setting.attribute not in _SERVE_ONLY_OUTPUT),
        *SERVER_SETTINGS,
    ),
    ServeSettings(),
    env_prefix=ENV_PREFIX,
)
_SERVER_TABLE: Final = SettingsTable(SERVER_SETTINGS, ServeSettings(), env_prefix=ENV_PREFIX)


def build_parser(*, serve: bool = False) -> argparse.ArgumentParser:
    if serve:
        parser = CommandParser(
            prog=f"{PROG} serve",
            description="Serve the rightsizing report, made again every --refresh: the page "
            "(sortable, filterable, with each workload's patch) at /, its JSON at /api/v1/report, "
            "its recommendations as Prometheus metrics at /metrics. Every flag can also be set "
            "by its environment variable or in the --config.file YAML.",
        )
        RIGHTSIZE_SERVE.add_arguments(parser)
        return parser
    parser = CommandParser(
        prog=PROG,
        description="Read GPU usage history from Prometheus (or any PromQL API: Thanos, Mimir, "
        "VictoriaMetrics) and recommend, per workload, what it should run on and what that saves. "
        "Every flag can also be set by its environment variable or in the --config.file YAML. "
        f"`{PROG} serve --help`: the same as a live report server.",
    )
    RIGHTSIZE.add_arguments(parser)
    return parser


def settings_table() -> str:
    """The README's flag table of `gpuscope rightsize`."""
    return RIGHTSIZE.table()


def server_settings_table() -> str:
    """The README's table of the flags `gpuscope rightsize serve` adds."""
    return _SERVER_TABLE.table()


def load(argv: Sequence[str], environ: Mapping[str, str]) -> RightsizeConfig:
    """The run's configuration from the command line, the environment and `--config.file`;
    raises `ConfigError` (one line) for the first thing wrong; a command line argparse refuses
    exits with status 2 after the usage and one line (`CommandParser`)."""
    flags = vars(build_parser().parse_args(argv))
    return configure(RightsizeSettings(**RIGHTSIZE.load(flags, environ)), environ)


def load_serve(argv: Sequence[str], environ: Mapping[str, str]) -> ServeConfig:
    """`gpuscope rightsize serve`'s configuration, checked as `load` checks a run's."""
    flags = vars(build_parser(serve=True).parse_args(argv))
    settings = ServeSettings(**RIGHTSIZE_SERVE.load(flags, environ))
    return ServeConfig(
        run=configure(settings, environ),
        listen_address=settings.listen_address,
        web_config_file=settings.web_config_file,
        max_requests=settings.max_requests,
        refresh=settings.refresh,
    )


# -- from settings to a run ---------------------------------------------------------------------


def configure(settings: RightsizeSettings, environ: Mapping[str, str]) -> RightsizeConfig:
    """Read the files the settings name and check what no single setting can."""
    if settings.window < 2 * settings.step:
        raise ConfigError("--window", "must span at least two steps")
    catalog = _catalog(settings.catalog_file)
    unknown = [m for m in settings.models if m not in {"all", "seen"} and catalog.find(m) is None]
    if unknown:
        raise ConfigError(
            "--models", f"{', '.join(unknown)} not in the catalog (use keys like h100-sxm, l4)"
        )
    try:
        prices = load_price_file(settings.prices_file, catalog) if settings.prices_file else {}
    except PriceFileError as error:
        raise ConfigError("--prices", str(error)) from None
    _check_output(settings)
    if settings.selector and settings.source != "gpuscope":
        raise ConfigError(
            "--selector",
            "matches the pod labels gpuscope's daemon exports (gpu_pod_info): it needs "
            "--source gpuscope (use --namespace with dcgm-exporter's series)",
        )
    return RightsizeConfig(
        connection=connection(settings, environ),
        selection=Selection(settings.namespaces, settings.selector),
        window=settings.window,
        step=settings.step,
        end=time.time() if settings.end is None else settings.end,
        strategy=settings.strategy,
        settings=StrategySettings(
            **{field.name: getattr(settings, field.name) for field in fields(StrategySettings)}
        ),
        output_format=settings.output_format,
        output=settings.output,
        configmap=settings.configmap,
        catalog=catalog,
        prices=prices,
        log_level=settings.log_level,
        log_format=settings.log_format,
        cluster_label=settings.cluster_label,
        min_confidence=settings.min_confidence,
        notify=settings.notify,
        notify_timeout=settings.notify_timeout,
        report_url=settings.report_url,
        fixed_end=settings.end is not None,
        source=settings.source,
        simulate=settings.simulate,
    )


def _check_output(settings: RightsizeSettings) -> None:
    """A directory format needs a directory; a ConfigMap holds one text; a text format writes
    a regular file (a FIFO would hold the job for ever once the report is ready)."""
    if settings.output_format not in DIRECTORIES:
        output = settings.output
        if output is not None and output.exists() and not output.is_file():
            shown = quote(str(output), PATH_QUOTE_LIMIT)
            raise ConfigError("--output", f"{shown} is not a regular file")
        return
    if settings.output is None:
        raise ConfigError(
            "--format", f"{settings.output_format} writes a directory: give --output DIR"
        )
    if settings.output.exists() and not settings.output.is_dir():
        shown = quote(str(settings.output), PATH_QUOTE_LIMIT)
        raise ConfigError("--output", f"{shown} is not a directory ({settings.output_format})")
    if settings.configmap is not None:
        raise ConfigError(
            "--configmap", f"keeps one text, not a {settings.output_format} directory"
        )


def _catalog(path: Path | None) -> Catalog:
    try:
        return load_catalog(path) if path is not None else builtin_catalog()
    except CatalogError as error:
        raise ConfigError("--catalog.file", str(error)) from None
