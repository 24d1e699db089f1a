"""`gpuscope rightsize`: read history from a PromQL API, recommend, report.

Exit status: 0 with a report, 1 when the report cannot be made (Prometheus unreachable or
refusing, the ConfigMap not writable), 2 for bad arguments. Each failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from exporter import logs
from exporter.catalog import Catalog, CatalogError, builtin_catalog, load_catalog
from exporter.durations import DurationError, format_duration, parse_duration
from exporter.rightsize.configmap import ConfigMapError, ConfigMapTarget, parse_target, write_report
from exporter.rightsize.formatters import EXTENSIONS, FORMATTERS, Output
from exporter.rightsize.hardware import Hardware, PriceFileError, load_price_file
from exporter.rightsize.history import fetch
from exporter.rightsize.prometheus import Connection, PrometheusClient, PrometheusError
from exporter.rightsize.report import build_report
from exporter.rightsize.selection import Selection, SelectionError, parse_namespaces, parse_selector
from exporter.rightsize.settings import (
    STRATEGY_SETTINGS,
    SettingsError,
    StrategySettings,
    load_settings,
)
from exporter.rightsize.strategy import STRATEGIES

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.rightsize.report import Report

log = logging.getLogger("exporter.rightsize")

PROG = "gpuscope rightsize"
TOKEN_ENV = "GPUSCOPE_PROMETHEUS_BEARER_TOKEN"  # noqa: S105 - a variable name, not a secret
PASSWORD_ENV = "GPUSCOPE_PROMETHEUS_PASSWORD"  # noqa: S105 - a variable name, not a secret


class UsageError(Exception):
    """A bad argument: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


@dataclass(frozen=True, slots=True)
class RightsizeConfig:
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Read GPU usage history from Prometheus (or any PromQL API: Thanos, Mimir, "
        "VictoriaMetrics) and recommend, per workload, what it should run on and what that saves.",
    )
    source = parser.add_argument_group("history")
    source.add_argument(
        "--prometheus",
        metavar="URL",
        required=True,
        help="Base URL of the PromQL API, e.g. http://prometheus:9090.",
    )
    source.add_argument(
        "--window",
        metavar="DURATION",
        default="14d",
        help="How far back to look (1h to 365d; default: 14d).",
    )
    source.add_argument(
        "--step",
        metavar="DURATION",
        default="5m",
        help="Resolution of the history: utilization is averaged per step (10s to 1d; at least twice the scrape interval; default: 5m).",
    )
    source.add_argument(
        "--end", metavar="TIME", help="End of the window: RFC 3339 or unix seconds (default: now)."
    )
    source.add_argument(
        "--namespace",
        metavar="NS",
        action="append",
        default=[],
        help="Only these namespaces (repeat or comma-separate; default: all).",
    )
    source.add_argument(
        "--selector",
        metavar="SELECTOR",
        help="Kubernetes label selector on pod labels, e.g. 'team=ml,tier in (batch)' (the daemon must export those labels).",
    )

    connection = parser.add_argument_group("connection")
    connection.add_argument(
        "--prometheus.bearer-token-file",
        dest="token_file",
        metavar="FILE",
        help=f"Send this file's token as a bearer token (or set {TOKEN_ENV}).",
    )
    connection.add_argument(
        "--prometheus.username",
        dest="username",
        metavar="USER",
        help=f"Basic-auth user; the password comes from --prometheus.password-file or {PASSWORD_ENV}.",
    )
    connection.add_argument(
        "--prometheus.password-file",
        dest="password_file",
        metavar="FILE",
        help="Basic-auth password file.",
    )
    connection.add_argument(
        "--prometheus.ca-file",
        dest="ca_file",
        metavar="FILE",
        help="CA certificate(s) to verify the server's TLS certificate.",
    )
    connection.add_argument(
        "--prometheus.insecure-skip-verify",
        dest="insecure",
        action="store_true",
        help="Do not verify the server's TLS certificate.",
    )
    connection.add_argument(
        "--prometheus.header",
        dest="headers",
        metavar="'NAME: VALUE'",
        action="append",
        default=[],
        help="Extra request header, e.g. 'X-Scope-OrgID: team-a' for Mimir (repeatable).",
    )
    connection.add_argument(
        "--prometheus.timeout",
        dest="timeout",
        metavar="DURATION",
        default="2m",
        help="Time limit of one query attempt (default: 2m).",
    )
    connection.add_argument(
        "--prometheus.concurrency",
        dest="concurrency",
        metavar="N",
        default="4",
        help="Queries in flight at once (1 to 32; default: 4).",
    )

    strategy = parser.add_argument_group("strategy")
    strategy.add_argument(
        "--strategy",
        default="simple",
        metavar="NAME",
        help=f"Strategy: {', '.join(sorted(STRATEGIES))} (default: simple).",
    )
    for setting in STRATEGY_SETTINGS:
        strategy.add_argument(
            setting.flag,
            dest=setting.attribute,
            metavar=setting.metavar,
            default=argparse.SUPPRESS,
            help=f"{setting.help} (default: {setting.shown_default()})",
        )
    strategy.add_argument(
        "--prices",
        metavar="FILE",
        help="YAML price file overriding the catalog's on-demand prices: prices: {h100-sxm: 4.1}.",
    )
    strategy.add_argument(
        "--catalog.file",
        dest="catalog_file",
        metavar="FILE",
        help="A GPU catalog replacing the built-in one.",
    )

    output = parser.add_argument_group("output")
    output.add_argument(
        "--format",
        dest="output_format",
        default="table",
        metavar="FORMAT",
        help=f"{' | '.join(FORMATTERS)} (default: table).",
    )
    output.add_argument(
        "--output", metavar="FILE", help="Write the report to FILE instead of standard output."
    )
    output.add_argument(
        "--configmap",
        metavar="NAMESPACE/NAME",
        help="Also keep the report in this ConfigMap (key report.EXT), replacing what it held.",
    )
    output.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=sorted(logs.LEVELS),
        help="Log level (default: info).",
    )
    output.add_argument(
        "--log.format",
        dest="log_format",
        default="logfmt",
        choices=("logfmt", "json"),
        help="Log format (default: logfmt).",
    )
    return parser


def _duration(flag: str, text: str, low: float, high: float) -> float:
    try:
        seconds = parse_duration(text)
    except DurationError as error:
        raise UsageError(f"invalid {flag}: {error}") from error
    if not low <= seconds <= high:
        raise UsageError(
            f"invalid {flag}: {format_duration(seconds)} is outside "
            f"{format_duration(low)}..{format_duration(high)}"
        )
    return seconds


def _read_secret(flag: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise UsageError(
            f"invalid {flag}: cannot read {path}: {error.strerror or error}"
        ) from error


def _end(text: str | None) -> float:
    if text is None:
        return time.time()
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"invalid --end: {text!r} is neither RFC 3339 nor unix seconds") from None
    if moment.tzinfo is None:
        raise UsageError(f"invalid --end: {text!r} needs a time zone (e.g. Z)")
    return moment.timestamp()


def _headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, colon, content = value.partition(":")
        if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
            raise UsageError(f"invalid --prometheus.header: {value!r} is not 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers


def parse_config(args: argparse.Namespace, environ: dict[str, str]) -> RightsizeConfig:
    """Every argument checked once; a bad one is a UsageError naming the flag."""
    step = _duration("--step", args.step, 10, 86400)
    window = _duration("--window", args.window, 3600, 365 * 86400)
    if window < 2 * step:
        raise UsageError("invalid --window: must span at least two steps")
    if args.strategy not in STRATEGIES:
        raise UsageError(
            f"invalid --strategy: {args.strategy!r} is not one of {', '.join(sorted(STRATEGIES))}"
        )
    if args.output_format not in FORMATTERS:
        raise UsageError(
            f"invalid --format: {args.output_format!r} is not one of {', '.join(FORMATTERS)}"
        )
    settings, catalog, prices = _strategy_inputs(args)
    try:
        configmap = parse_target(args.configmap) if args.configmap else None
    except ValueError as error:
        raise UsageError(f"invalid --configmap: {error}") from error
    return RightsizeConfig(
        connection=_connection(args, environ),
        selection=_selection(args),
        window=window,
        step=step,
        end=_end(args.end),
        strategy=args.strategy,
        settings=settings,
        output_format=args.output_format,
        output=Path(args.output) if args.output else None,
        configmap=configmap,
        catalog=catalog,
        prices=prices,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def _connection(args: argparse.Namespace, environ: dict[str, str]) -> Connection:
    url = args.prometheus.strip()
    if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
        raise UsageError(f"invalid --prometheus: {url!r} is not an http:// or https:// URL")
    timeout = _duration("--prometheus.timeout", args.timeout, 1, 3600)
    try:
        concurrency = int(args.concurrency)
    except ValueError:
        raise UsageError(
            f"invalid --prometheus.concurrency: {args.concurrency!r} is not a number"
        ) from None
    if not 1 <= concurrency <= 32:
        raise UsageError(f"invalid --prometheus.concurrency: {concurrency} is outside 1..32")
    token = environ.get(TOKEN_ENV)
    if args.token_file:
        token = _read_secret("--prometheus.bearer-token-file", args.token_file)
    password = environ.get(PASSWORD_ENV)
    if args.password_file:
        password = _read_secret("--prometheus.password-file", args.password_file)
    if args.password_file and args.username is None:
        raise UsageError("invalid --prometheus.password-file: needs --prometheus.username")
    if password and args.username is None:
        raise UsageError(f"invalid {PASSWORD_ENV}: a password needs --prometheus.username")
    if token and args.username:
        raise UsageError(
            "invalid --prometheus.username: choose bearer token or basic auth, not both"
        )
    if args.ca_file and not Path(args.ca_file).is_file():
        raise UsageError(f"invalid --prometheus.ca-file: {args.ca_file} is not a readable file")
    return Connection(
        url=url,
        bearer_token=token or None,
        username=args.username,
        password=password,
        ca_file=Path(args.ca_file) if args.ca_file else None,
        insecure_skip_verify=args.insecure,
        headers=_headers(args.headers),
        timeout_seconds=timeout,
        concurrency=concurrency,
    )


def _selection(args: argparse.Namespace) -> Selection:
    try:
        namespaces = parse_namespaces(args.namespace)
    except SelectionError as error:
        raise UsageError(f"invalid --namespace: {error}") from error
    try:
        requirements = parse_selector(args.selector) if args.selector else ()
    except SelectionError as error:
        raise UsageError(f"invalid --selector: {error}") from error
    return Selection(namespaces, requirements)


def _strategy_inputs(
    args: argparse.Namespace,
) -> tuple[StrategySettings, Catalog, dict[str, float]]:
    raw = {
        s.attribute: getattr(args, s.attribute)
        for s in STRATEGY_SETTINGS
        if hasattr(args, s.attribute)
    }
    try:
        settings = load_settings(raw)
    except SettingsError as error:
        raise UsageError(str(error)) from error
    try:
        catalog = load_catalog(Path(args.catalog_file)) if args.catalog_file else builtin_catalog()
    except CatalogError as error:
        raise UsageError(f"invalid --catalog.file: {error}") from error
    unknown = [m for m in settings.models if m not in {"all", "seen"} and catalog.find(m) is None]
    if unknown:
        raise UsageError(
            f"invalid --models: {', '.join(unknown)} not in the catalog "
            "(use keys like h100-sxm, l4)"
        )
    try:
        prices = load_price_file(Path(args.prices), catalog) if args.prices else {}
    except PriceFileError as error:
        raise UsageError(f"invalid --prices: {error}") from error
    return settings, catalog, prices


async def produce(config: RightsizeConfig) -> Report:
    """History from the PromQL API, then the report (the only I/O is the client's)."""
    started = time.monotonic()
    async with PrometheusClient(config.connection) as client:
        history = await fetch(
            client,
            selection=config.selection,
            end=config.end,
            window=config.window,
            step=config.step,
            quantile=config.settings.percentile,
        )
        queries = client.queries_sent
    hardware = Hardware.build(
        config.catalog,
        history.ceilings,
        config.prices,
        seen=(workload.model for workload in history.workloads),
    )
    report = build_report(
        history,
        strategy=STRATEGIES[config.strategy],
        hardware=hardware,
        settings=config.settings,
        source=config.connection.url,
    )
    log.info(
        "report ready",
        extra={
            "workloads": len(report.rows),
            "queries": queries,
            "seconds": round(time.monotonic() - started, 2),
            "savings_usd_per_month": round(report.total.savings, 2),
        },
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        config = parse_config(args, dict(os.environ))
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_format)
    try:
        report = asyncio.run(produce(config))
    except PrometheusError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    terminal = config.output is None and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else 180
    text = FORMATTERS[config.output_format](report, Output(terminal=terminal, width=width))
    try:
        if config.output is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            config.output.write_text(text, encoding="utf-8")
        if config.configmap is not None:
            key = f"report.{EXTENSIONS[config.output_format]}"
            write_report(config.configmap, key, text, generated_at=report.end)
            log.info("configmap written", extra={"configmap": str(config.configmap), "key": key})
    except OSError as error:
        print(
            f"{PROG}: error: cannot write {config.output}: {error.strerror or error}",
            file=sys.stderr,
        )
        return 1
    except ConfigMapError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    return 0
