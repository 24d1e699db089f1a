"""The `html` format, and the page `gpuscope rightsize serve` serves: a self-contained page
(inline CSS, SVG plots and one small script that sorts and filters the workloads by cluster,
namespace, class and confidence, keeping that state in the URL's fragment; nothing fetched),
rendered from the Jinja2 templates in `templates/` with every value escaped by the environment
(autoescape) and every name the templates use defined (StrictUndefined). Each workload's patch
is on the page. Jinja2 is imported only when the format is used."""

from __future__ import annotations

import shlex
from functools import cache
from typing import TYPE_CHECKING, Final

import yaml

from exporter.durations import format_duration
from exporter.rightsize.confidence import LEVELS
from exporter.rightsize.formatters import common, plots, replay_plot
from exporter.rightsize.formatters.common import Format, Output
from exporter.rightsize.replay.summary import COLUMNS, policy_rows, sentence
from exporter.rightsize.report import money_text
from exporter.rightsize.strategy import CLASSIFICATIONS

if TYPE_CHECKING:
    import jinja2

    from exporter.rightsize.patches import Patch
    from exporter.rightsize.report import Report

TEMPLATE: Final = "report.html.j2"


@cache
def environment() -> jinja2.Environment:
    """The templates' environment: the package's `templates/`, autoescaped, strict."""
    import jinja2  # noqa: PLC0415 - only this format needs it

    env = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__ or "exporter.rightsize.formatters"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["px"] = lambda value: f"{value:.1f}"
    env.globals.update(
        colors=common.COLORS,
        current_label=common.current_label,
        duration=format_duration,
        footer=common.footer,
        gib=common.gib,
        levels=LEVELS,
        money=money_text,
        patch_command=patch_command,
        patch_yaml=patch_yaml,
        per_million_tokens=common.per_million_tokens,
        percent=common.percent,
        tokens_note=common.TOKENS_NOTE,
        recommendation_label=common.recommendation_label,
        timestamp=common.timestamp,
        title=common.title,
        usd=common.usd,
        price_label=common.price_label,
        workload_label=common.workload_label,
    )
    return env


def patch_yaml(patch: Patch) -> str:
    return yaml.safe_dump(patch.body, sort_keys=False, allow_unicode=True)


def patch_command(patch: Patch) -> str:
    return shlex.join(patch.command())


def format_html(report: Report, output: Output) -> str:
    present = {row.recommendation.classification for row in report.rows}
    return (
        environment()
        .get_template(TEMPLATE)
        .render(
            report=report,
            output=output,
            p=common.percentile(report),
            clusters=sorted({row.cluster for row in report.rows}),
            namespaces=sorted({row.history.namespace for row in report.rows}),
            classes=[name for name in CLASSIFICATIONS if name in present],
            rooflines=[plots.roofline(roofline) for roofline in report.rooflines],
            consolidation_plot=plots.consolidation(report.consolidation),
            replay_plot=replay_plot.replay(
                report.simulation, end=report.end, step=report.step_seconds
            )
            if report.simulation
            else None,
            replay_columns=COLUMNS,
            replay_rows=policy_rows(report.simulation),
            replay_sentence=sentence(report.simulation, saturation=report.settings.saturation),
        )
    )


HTML: Final = Format("html", "html", format_html)
