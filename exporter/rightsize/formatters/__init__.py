"""Report formats, by name: `Report` -> text.

One module per format: `structured` (`json` and `yaml`, from one document that carries
everything: `report_document`), `csv` (one row per workload), `markdown`, `table` (rich's, in
colour on a terminal) and `html` (self-contained, from Jinja2 templates with inline SVG plots
and a script that sorts and filters). A format is a `Format` (name, file extension, renderer)
listed in `FORMATS`; `--format <name>` selects it, and the ConfigMap key is `report.<extension>`.
`patches` is a directory rather than a text (`--output DIR`): `DIRECTORIES` maps its name to the
files it writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.rightsize.formatters.common import Format, Output, Render
from exporter.rightsize.formatters.csv import CSV, CSV_COLUMNS
from exporter.rightsize.formatters.html import HTML
from exporter.rightsize.formatters.markdown import MARKDOWN
from exporter.rightsize.formatters.patches import patch_files
from exporter.rightsize.formatters.structured import JSON, YAML, report_document
from exporter.rightsize.formatters.table import TABLE

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.rightsize.report import Report

__all__ = [
    "CSV_COLUMNS",
    "DIRECTORIES",
    "EXTENSIONS",
    "FORMATS",
    "FORMATTERS",
    "Format",
    "Output",
    "Render",
    "report_document",
]

FORMATS: Final = (JSON, YAML, CSV, MARKDOWN, TABLE, HTML)
"""Every format, in the order `--help` lists them."""
FORMATTERS: Final[dict[str, Render]] = {entry.name: entry.render for entry in FORMATS}
EXTENSIONS: Final[dict[str, str]] = {entry.name: entry.extension for entry in FORMATS}
DIRECTORIES: Final[dict[str, Callable[[Report], dict[str, str]]]] = {"patches": patch_files}
"""Formats written as a directory of files (`--output DIR`), by name."""
