#!/usr/bin/env python3
"""Keep the documentation's reference tables equal to the code they describe.

    scripts/reference.py          # rewrite every generated section
    scripts/reference.py --check  # exit 1 naming the sections that differ (the tests run this)

A generated section sits, in one page under docs/, between `<!-- generated: NAME -->` and
`<!-- end: NAME -->`; NAME is one of `SECTIONS`, each made by a function of the package: the flag
tables from the settings' declarations, the metrics table from the family declarations, the
DCGM field table from its declarations.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.calibrate.options import settings_table as calibrate_settings_table  # noqa: E402
from exporter.config import collectors_table, profiles_table, settings_table  # noqa: E402
from exporter.dcgm.table import fields_table as dcgm_fields_table  # noqa: E402
from exporter.dcgm.table import renames_table as dcgm_renames_table  # noqa: E402
from exporter.metrics.table import metrics_table  # noqa: E402
from exporter.rightsize.exposition import metrics_table as rightsize_metrics_table  # noqa: E402
from exporter.rightsize.options import server_settings_table  # noqa: E402
from exporter.rightsize.options import settings_table as rightsize_settings_table  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

DOCS = ROOT / "docs"
SECTIONS: dict[str, Callable[[], str]] = {
    "serve-flags": settings_table,
    "collectors": collectors_table,
    "profiles": profiles_table,
    "metrics": metrics_table,
    "dcgm-fields": dcgm_fields_table,
    "dcgm-renames": dcgm_renames_table,
    "calibrate-flags": calibrate_settings_table,
    "rightsize-flags": rightsize_settings_table,
    "rightsize-serve-flags": server_settings_table,
    "rightsize-metrics": rightsize_metrics_table,
}


def sections_in(text: str) -> list[tuple[str, re.Match[str]]]:
    """The generated sections `text` holds, by name."""
    found = []
    for name in SECTIONS:
        pattern = re.compile(
            rf"(<!-- generated: {re.escape(name)} -->\n)(.*?)(<!-- end: {re.escape(name)} -->)",
            re.DOTALL,
        )
        match = pattern.search(text)
        if match is not None:
            found.append((name, match))
    return found


def render(pages: dict[Path, str]) -> tuple[dict[Path, str], list[str]]:
    """Each page with its generated sections made again, and the names of those that changed.
    Every section must sit in exactly one page."""
    where: dict[str, list[Path]] = {name: [] for name in SECTIONS}
    changed: list[str] = []
    fresh_pages = {}
    for path, original in pages.items():
        text = original
        for name, match in sorted(sections_in(text), key=lambda found: -found[1].start()):
            where[name].append(path)
            fresh = SECTIONS[name]().rstrip("\n") + "\n"
            if match[2] != fresh:
                changed.append(name)
                text = text[: match.start(2)] + fresh + text[match.end(2) :]
        fresh_pages[path] = text
    for name, paths in where.items():
        if len(paths) != 1:
            raise SystemExit(
                f"scripts/reference.py: section {name!r} is in {len(paths)} pages, not one"
            )
    return fresh_pages, sorted(changed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a section differs")
    args = parser.parse_args()
    pages = {path: path.read_text(encoding="utf-8") for path in sorted(DOCS.rglob("*.md"))}
    fresh, changed = render(pages)
    if args.check:
        if changed:
            print(f"docs: regenerate {', '.join(changed)} with scripts/reference.py")
            return 1
        return 0
    for path, text in fresh.items():
        if text != pages[path]:
            path.write_text(text, encoding="utf-8")
    for name in changed:
        print(f"docs: {name} regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
