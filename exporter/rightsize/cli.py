"""`gpuscope rightsize`: read history from a PromQL API, recommend, report.

Exit status: 0 with a report, 1 when the report cannot be made (Prometheus unreachable or
refusing, the ConfigMap not writable), 2 for bad settings (`exporter/rightsize/options.py`,
checked before any query). Each failure is one line on stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING

from exporter import logs
from exporter.rightsize.configmap import ConfigMapError, write_report
from exporter.rightsize.formatters import EXTENSIONS, FORMATTERS, Output
from exporter.rightsize.hardware import Hardware
from exporter.rightsize.history import fetch
from exporter.rightsize.options import PROG, RightsizeConfig, UsageError, load
from exporter.rightsize.prometheus import PrometheusClient, PrometheusError
from exporter.rightsize.report import build_report
from exporter.rightsize.strategy import STRATEGIES
from exporter.settings import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.rightsize.report import Report

log = logging.getLogger("exporter.rightsize")


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


def main(argv: Sequence[str]) -> int:
    """Run `gpuscope rightsize` with these arguments; the exit status."""
    try:
        config = load(argv, os.environ)
    except (UsageError, ConfigError) as error:
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
