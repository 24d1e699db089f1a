#!/usr/bin/env python3
"""Keep the README's generated tables equal to the code they describe.

    scripts/readme.py          # rewrite every generated section
    scripts/readme.py --check  # exit 1 naming the sections that differ (the tests run this)

A generated section sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; NAME is one
of `SECTIONS`, each made by a function of the package: the flag table from the settings'
declarations, the metrics table from the family declarations.
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
from exporter.metrics.table import metrics_table  # noqa: E402
from exporter.rightsize.options import server_settings_table  # noqa: E402
from exporter.rightsize.options import settings_table as rightsize_settings_table  # noqa: E402
from exporter.rightsize.server import metrics_table as rightsize_metrics_table  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

README = ROOT / "README.md"
SECTIONS: dict[str, Callable[[], str]] = {
    "serve-flags": settings_table,
    "collectors": collectors_table,
    "profiles": profiles_table,
    "metrics": metrics_table,
    "dcgm-fields": dcgm_fields_table,
    "calibrate-flags": calibrate_settings_table,
    "rightsize-flags": rightsize_settings_table,
    "rightsize-serve-flags": server_settings_table,
    "rightsize-metrics": rightsize_metrics_table,
}


def render(text: str) -> tuple[str, list[str]]:
    """The README with every section regenerated, and the names of those that changed."""
    changed: list[str] = []
    for name, make in SECTIONS.items():
        pattern = re.compile(
            rf"(<!-- generated: {re.escape(name)} -->\n)(.*?)(<!-- end: {re.escape(name)} -->)",
            re.DOTALL,
        )
        match = pattern.search(text)
        if match is None:
            raise SystemExit(f"scripts/readme.py: README.md has no generated section {name!r}")
        fresh = make().rstrip("\n") + "\n"
        if match[2] != fresh:
            changed.append(name)
            text = text[: match.start(2)] + fresh + text[match.end(2) :]
    return text, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a section differs")
    args = parser.parse_args()
    text, changed = render(README.read_text(encoding="utf-8"))
    if args.check:
        if changed:
            print(f"README.md: regenerate {', '.join(changed)} with scripts/readme.py")
            return 1
        return 0
    README.write_text(text, encoding="utf-8")
    for name in changed:
        print(f"README.md: {name} regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
