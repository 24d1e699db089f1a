"""Generate gpuscope's Grafana dashboards: `python -m dashboards.build` rewrites dashboards/*.json.

The JSON files are what users import and what the Helm chart ships; this package is their single
source: a module per dashboard (cluster_overview, node, workloads, exporter_health, rightsizing,
serving)
on one panel layer (panels: a function per panel type; layout: the grid, variables, annotations
and the dashboard around them; queries: PromQL that more than one dashboard uses), so they share one
look, one datasource variable and one set of helpers. This module lists them and writes the
files; the tests check that the committed files equal its output (`--check` does the same).

Conventions every panel follows: the datasource is the `${datasource}` variable (no uid is
hard-coded); rates use `$__rate_interval`; utilization comes from the integrated `_seconds_total`
counters, not from sampled gauges; variables are multi-value with "All" = `.*`, so every matcher
on a variable is a regex matcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dashboards import cluster_overview, exporter_health, node, rightsizing, serving, workloads

if TYPE_CHECKING:
    from collections.abc import Callable

    from dashboards.panels import Json

DIRECTORY: Final = Path(__file__).resolve().parent

DASHBOARDS: Final = {
    "cluster-overview.json": cluster_overview.make,
    "node.json": node.make,
    "workloads.json": workloads.make,
    "exporter-health.json": exporter_health.make,
    "rightsizing.json": rightsizing.make,
    "serving.json": serving.make,
}


def render(make: Callable[[], Json]) -> str:
    """A dashboard as the committed file holds it: stable key order, two-space indent."""
    return json.dumps(make(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs instead of writing"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        path = DIRECTORY / name
        text = render(make)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            f"dashboards out of date (run python -m dashboards.build): {', '.join(stale)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
