"""Report formats, by name: `Report` -> text.

One module per format: `structured` (`json` and `yaml`, from one document that carries
everything: `report_document`), `csv` (one row per workload), `markdown`, `table` (rich's, in
colour on a terminal) and `html` (self-contained, from Jinja2 templates with two inline SVG
plots). A format is a `Format` (name, file extension, renderer) listed in `FORMATS`; `--format
<name>` selects it, and the ConfigMap key is `report.<extension>`.
"""

from __future__ import annotations

from typing import Final

from exporter.rightsize.formatters.common import Format, Output, Render
from exporter.rightsize.formatters.csv import CSV, CSV_COLUMNS
from exporter.rightsize.formatters.html import HTML
from exporter.rightsize.formatters.markdown import MARKDOWN
from exporter.rightsize.formatters.structured import JSON, YAML, report_document
from exporter.rightsize.formatters.table import TABLE

__all__ = [
    "CSV_COLUMNS",
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
