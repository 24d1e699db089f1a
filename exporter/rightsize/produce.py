"""One report, from the PromQL API's history to the recommendations: what `gpuscope rightsize`
runs once and `gpuscope rightsize serve` runs on each refresh."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter.rightsize.fetch import fetch
from exporter.rightsize.hardware import Hardware
from exporter.rightsize.prometheus import PrometheusClient
from exporter.rightsize.replay.cut import NEVER
from exporter.rightsize.replay.express import placement_patches
from exporter.rightsize.replay.run import simulate
from exporter.rightsize.replay.steps import fetch_steps
from exporter.rightsize.report import build_report
from exporter.rightsize.strategy import STRATEGIES

if TYPE_CHECKING:
    from exporter.rightsize.options import RightsizeConfig
    from exporter.rightsize.replay.cut import Cut
    from exporter.rightsize.report import Report

log = logging.getLogger("exporter.rightsize")


async def produce(config: RightsizeConfig, *, cut: Cut = NEVER) -> Report:
    """History from the PromQL API, then the report (the only I/O is the client's); `cut` may
    stop the policy replay part-way (`ReplayCut`)."""
    started = time.monotonic()
    async with PrometheusClient(config.connection) as client:
        history = await fetch(
            client,
            selection=config.selection,
            end=config.end,
            window=config.window,
            step=config.step,
            quantile=config.settings.percentile,
            cluster_label=config.cluster_label,
            source=config.source,
        )
        steps = None
        if config.simulate:
            steps = await fetch_steps(
                client,
                selection=config.selection,
                end=config.end,
                window=config.window,
                step=config.step,
                cluster_label=config.cluster_label,
                configurations=len(history.workloads),
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
        source=config.connection.shown,
        min_confidence=config.min_confidence,
    )
    if steps is not None:
        simulation = simulate(report, steps, hardware=hardware, policies=config.simulate, cut=cut)
        report = replace(report, simulation=simulation)
        report = replace(
            report,
            placement_patches=placement_patches(
                report, hardware=hardware, inventory=history.resources, seen_models=hardware.seen
            ),
        )
    elif config.simulate:
        report = replace(report, missing_signals=(*report.missing_signals, "replay"))
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
