"""The `html` format: a self-contained page (inline CSS and SVG plots, no script, nothing
fetched), rendered from the Jinja2 templates in `templates/` with every value escaped by the
environment (autoescape) and every name the templates use defined (StrictUndefined). Jinja2 is
imported only when the format is used."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.formatters import common, plots
from exporter.rightsize.formatters.common import Format, Output
from exporter.rightsize.report import money_text

if TYPE_CHECKING:
    import jinja2

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
        money=money_text,
        percent=common.percent,
        recommendation_label=common.recommendation_label,
        timestamp=common.timestamp,
        title=common.title,
        usd=common.usd,
    )
    return env


def format_html(report: Report, _output: Output) -> str:
    return (
        environment()
        .get_template(TEMPLATE)
        .render(
            report=report,
            p=common.percentile(report),
            rooflines=[plots.roofline(roofline) for roofline in report.rooflines],
            consolidation_plot=plots.consolidation(report.consolidation),
        )
    )


HTML: Final = Format("html", "html", format_html)
