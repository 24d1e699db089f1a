"""`scripts/try-serving`: the serving demo. A simulated node whose pods serve models
(tests/fixtures/fleets/serving.yaml), the stand-in inference servers of tests/serving_server.py
scraped beside it with their pods' labels, and Prometheus with gpuscope's rules on loopback, so
the Serving efficiency dashboard has data from the first minute: point a Grafana at the
Prometheus it prints and import dashboards/serving.json, until Ctrl-C. With `--screenshot` it
waits until gpuscope's own counters have the 5 minutes the rules' rates span (the servers'
history is backfilled; the node's is not), then draws the last two minutes of the dashboard into
docs/dashboards/serving.png instead."""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from dashboards import render
from dashboards.draw import Source, Window
from dashboards.live import Node, wait_until
from tests.helpers import ROOT, require_tool
from tests.serving_server import SERVED, SERVING_FLEET, ServingStack

PICTURE: Final = ROOT / "docs" / "dashboards" / "serving.png"
DASHBOARD: Final = ROOT / "dashboards" / "serving.json"
SETTLE_SECONDS: Final = 320
"""Until the node's energy and busy counters fill the rules' 5-minute rate windows."""
SCREENSHOT_SECONDS: Final = 120
NODE: Final = Node("sim-serving", SERVING_FLEET, ("--carbon.intensity=400",))
"""The grid's carbon intensity set to 400 gCO2e/kWh, so the CO2e panels have data."""


def main(argv: list[str]) -> int:
    shoot = "--screenshot" in argv
    # A stop request unwinds like Ctrl-C, so the stack stops its daemon, servers and Prometheus.
    signal.signal(signal.SIGTERM, lambda number, _: sys.exit(128 + number))
    with (
        tempfile.TemporaryDirectory(prefix="gpuscope-serving-") as workdir,
        ServingStack(
            [NODE], Path(workdir), served=SERVED, promtool_binary=require_tool("promtool")
        ) as stack,
    ):
        prometheus = stack.prometheus
        wait_until(
            "the serving rules",
            lambda: (
                prometheus.value("count(workload:gpu_cost_usd_per_million_output_tokens)")
                is not None
            ),
            60,
        )
        if not shoot:
            print(
                f"Prometheus with gpuscope's rules: {prometheus.url} (the node's gpuscope: "
                f"http://127.0.0.1:{stack.ports[NODE.name]}/metrics)\n"
                "Add it as a Prometheus data source in Grafana and import dashboards/serving.json "
                "(Ctrl-C stops).",
                flush=True,
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                # Ctrl-C is how the demo ends: the stack stops as it unwinds, without a traceback.
                print("try-serving: stopping", file=sys.stderr, flush=True)
                return 0
        print(f"collecting {SETTLE_SECONDS + SCREENSHOT_SECONDS} s of data...", flush=True)
        time.sleep(SETTLE_SECONDS + SCREENSHOT_SECONDS)
        end = time.time()
        window = Window(start=end - SCREENSHOT_SECONDS, end=end, step=1.0)
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        render.save(dashboard, Source(prometheus, window, 1.0), PICTURE)
        print(PICTURE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
