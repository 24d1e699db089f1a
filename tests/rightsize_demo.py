"""`scripts/try-rightsize`: the test scenario's history in a throwaway Prometheus, and its report."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from exporter.rightsize.cli import main as rightsize
from tests.helpers import ROOT, require_tool
from tests.prometheus_server import running_prometheus
from tests.rightsize_scenario import CALIBRATION, END, WORKLOADS
from tests.synthetic_history import backfill, write_openmetrics

SCREENSHOT = ROOT / "docs" / "rightsize-report.png"


def screenshot(page: Path, out: Path, scratch: Path) -> None:
    """A 1400x1500 PNG of the HTML report `page`, drawn by headless Chromium."""
    subprocess.run(
        [
            require_tool("chromium"),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={scratch / 'chromium'}",
            "--window-size=1400,1500",
            "--hide-scrollbars",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )


def main(argv: list[str]) -> int:
    shoot = "--screenshot" in argv
    extra = [arg for arg in argv if arg != "--screenshot"]
    with tempfile.TemporaryDirectory(prefix="gpuscope-try-") as scratch_name:
        scratch = Path(scratch_name)
        openmetrics = scratch / "history.om"
        with openmetrics.open("w") as out:
            write_openmetrics(
                out,
                WORKLOADS,
                end=END,
                duration=14 * 86400 + 3600,
                interval=120,
                calibration=CALIBRATION,
            )
        backfill(require_tool("promtool"), openmetrics, scratch / "data")
        openmetrics.unlink()
        with running_prometheus(scratch / "data") as url:
            print(f"try-rightsize: Prometheus with 14 days of history at {url}", file=sys.stderr)
            arguments = ["--prometheus", url, f"--end={END}"]
            status = rightsize(
                [*arguments, "--format=html", "--output=report.html", "--log.level=warn"]
            )
            if status == 0 and shoot:
                screenshot(Path("report.html").resolve(), SCREENSHOT, scratch)
                print(f"try-rightsize: wrote {SCREENSHOT.relative_to(ROOT)}", file=sys.stderr)
            if status == 0:
                print("try-rightsize: wrote report.html", file=sys.stderr)
                status = rightsize([*arguments, *extra])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
