"""`scripts/try-rightsize`: the test scenario's history in a throwaway Prometheus, and its report;
`scripts/try-rightsize serve`: the report server on it, in a browser."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import webbrowser
from pathlib import Path

from dashboards import render
from dashboards.draw import Source, Window
from dashboards.live import Prometheus
from exporter.rightsize.cli import main as rightsize
from tests import dcgm_history_data as dcgm_history
from tests.helpers import ROOT, eventually, require_tool
from tests.prometheus_server import running_prometheus
from tests.rightsize_browser import browser
from tests.rightsize_scenario import END
from tests.rightsize_stack import history, serving

SCREENSHOT = ROOT / "docs" / "rightsize-report.png"
REPLAY_SCREENSHOT = ROOT / "docs" / "rightsize-replay.png"
REPLAYED = "--simulate=current,exclusive,mig,timeslice,binpack"
"""What the pictures replay, so that the page and the dashboard draw the replay."""
DASHBOARD_PICTURE = ROOT / "docs" / "dashboards" / "rightsizing.png"
DASHBOARD_SECONDS = 30
PORT = 9456


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


def draw_rightsizing_dashboard(url: str) -> None:
    """The Rightsizing dashboard from the last `DASHBOARD_SECONDS` of the server's scraped
    series, as the other dashboards' pictures are drawn (dashboards.render)."""
    prometheus = Prometheus(url)
    eventually(
        lambda: (
            (prometheus.value("count_over_time(gpuscope_rightsize_last_refresh_success[5m])") or 0)
            >= DASHBOARD_SECONDS
        ),
        DASHBOARD_SECONDS * 3,
        "the server's series in Prometheus",
    )
    end = time.time()
    window = Window(start=end - DASHBOARD_SECONDS, end=end, step=1.0)
    dashboard = json.loads((ROOT / "dashboards" / "rightsizing.json").read_text(encoding="utf-8"))
    render.save(dashboard, Source(prometheus, window, 1.0), DASHBOARD_PICTURE)


def serve(argv: list[str]) -> int:
    """The server on the scenario's history, scraped by the Prometheus that holds it; its page
    opened in a browser (or, with --screenshot, drawn into the README's pictures with its
    replay of every policy and the Rightsizing dashboard) and its patches unpacked beside the
    history; until Ctrl-C."""
    shoot = "--screenshot" in argv
    extra = [arg for arg in argv if arg != "--screenshot"]
    if shoot and not any(arg.startswith("--simulate") for arg in extra):
        extra.append(REPLAYED)
    with tempfile.TemporaryDirectory(prefix="gpuscope-try-") as scratch_name:
        scratch = Path(scratch_name)
        data = history(scratch)
        with (
            running_prometheus(data, scrape=(f"127.0.0.1:{PORT}", 1.0 if shoot else 15.0)) as url,
            # The replay's 14 days of 5-minute steps take a minute or more to ask.
            serving(url, PORT, "--refresh=1h", *extra, ready_timeout=600) as server,
        ):
            status, tarball = server.get("/patches.tar.gz")
            if status == 200:
                patches = scratch / "rightsize-patches"
                with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
                    patches.mkdir()
                    for member in tar.getmembers():
                        target = patches / Path(member.name).name
                        target.write_bytes((tar.extractfile(member) or io.BytesIO()).read())
                        target.chmod(member.mode)
                print(
                    f"try-rightsize: the patches are in {patches}/ (apply.sh), while it runs",
                    file=sys.stderr,
                )
            if shoot:
                with browser(scratch, height=2100) as page:
                    page.navigate(f"{server.url}/")  # every workload: the table fits
                    page.click("#workloads tbody tr:not([hidden]) details:last-of-type summary")
                    page.evaluate("window.scrollTo(0, 0)")
                    page.screenshot(SCREENSHOT)
                    page.element_screenshot("figure.replay", REPLAY_SCREENSHOT)
                draw_rightsizing_dashboard(url)
                for written in (SCREENSHOT, REPLAY_SCREENSHOT, DASHBOARD_PICTURE):
                    print(f"try-rightsize: wrote {written.relative_to(ROOT)}", file=sys.stderr)
                return 0
            print(
                f"try-rightsize: the report at {server.url}/ (its JSON at /api/v1/report, "
                f"metrics at /metrics, scraped by {url}); Ctrl-C stops",
                file=sys.stderr,
            )
            webbrowser.open(f"{server.url}/")
            try:
                server.process.wait()
            except KeyboardInterrupt:
                print("try-rightsize: stopping", file=sys.stderr)
    return 0


def dcgm_exporter_source(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether `--source dcgm-exporter` (or `--source=dcgm-exporter`) was asked for, and the
    other arguments."""
    rest: list[str] = []
    chosen = False
    index = 0
    while index < len(argv):
        if argv[index] == "--source=dcgm-exporter":
            chosen, index = True, index + 1
        elif argv[index : index + 2] == ["--source", "dcgm-exporter"]:
            chosen, index = True, index + 2
        else:
            rest.append(argv[index])
            index += 1
    return chosen, rest


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    # `--source dcgm-exporter`: what a cluster that never ran gpuscope has, a week of
    # dcgm-exporter's and kube-state-metrics' series, and what gpuscope recommends from it.
    dcgm, argv = dcgm_exporter_source(argv)
    with tempfile.TemporaryDirectory(prefix="gpuscope-try-") as scratch_name:
        scratch = Path(scratch_name)
        data = dcgm_history.backfilled(scratch) if dcgm else history(scratch)
        with running_prometheus(data) as url:
            held = (
                "a week of dcgm-exporter and kube-state-metrics history (no gpuscope series)"
                if dcgm
                else "14 days of history"
            )
            print(f"try-rightsize: Prometheus with {held} at {url}", file=sys.stderr)
            arguments = ["--prometheus", url, f"--end={END}"]
            if dcgm:
                arguments = ["--prometheus", url, f"--end={dcgm_history.END}", "--window=7d"]
                arguments.append("--source=dcgm-exporter")
            status = rightsize(
                [*arguments, "--format=html", "--output=report.html", "--log.level=warn"]
            )
            if status == 0:
                print("try-rightsize: wrote report.html", file=sys.stderr)
                status = rightsize([*arguments, *argv])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
