"""Draw a GPU trace (`gpuscope trace`'s JSON) as a timeline laid out as Perfetto lays out its
counter tracks — a group per GPU, a track per counter and per pod — and render it to PNG with
headless Chromium. For the docs' picture only: Perfetto's own UI (ui.perfetto.dev) cannot be
reached from the machines this project is built on, and no package serves it offline.

    .venv/bin/python scripts/trace_picture.py TRACE.json OUT.png
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

WIDTH = 1400
LABEL = 340
TRACK = 34
HEADER = 30
AXIS = 34
COUNTERS = ("utilization", "memory_used", "power", "sm_clock")
UNITS = {"utilization": "%", "memory_used": "GiB", "power": "W", "sm_clock": "MHz"}
COLOURS = {"utilization": "#3b78e7", "memory_used": "#8e44ad", "power": "#e8710a"}
POD_COLOUR = "#1e8e3e"


def main(source: Path, output: Path) -> None:
    events = json.loads(source.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    tracks: dict[int, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for event in events:
        if event["ph"] == "C":
            tracks[event["pid"]][event["name"]].append((event["ts"], event["args"]["value"]))
    times = [at for per_gpu in tracks.values() for points in per_gpu.values() for at, _ in points]
    start, end = min(times), max(times)
    rows: list[str] = []
    y = AXIS
    for pid in sorted(names):
        rows.append(
            f'<rect x="0" y="{y}" width="{WIDTH}" height="{HEADER}" fill="#e8eaed"/>'
            f'<text x="8" y="{y + 20}" class="gpu">&#9662; {html.escape(names[pid])}</text>'
        )
        y += HEADER
        per_gpu = tracks[pid]
        ordered = [name for name in COUNTERS if name in per_gpu]
        ordered += sorted(name for name in per_gpu if name not in COUNTERS)
        for name in ordered:
            rows.append(_track(name, per_gpu[name], y, start, end))
            y += TRACK
    ticks = []
    seconds = (end - start) / 1e6
    for second in range(int(seconds) + 1):
        x = LABEL + (WIDTH - LABEL - 10) * second / max(seconds, 1e-9)
        ticks.append(
            f'<line x1="{x:.1f}" y1="{AXIS - 8}" x2="{x:.1f}" y2="{y}" stroke="#dadce0"/>'
            f'<text x="{x + 3:.1f}" y="{AXIS - 12}" class="tick">{second} s</text>'
        )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; background: #fff; font-family: sans-serif; }}
.gpu {{ font-size: 14px; font-weight: bold; fill: #202124; }}
.name {{ font-size: 13px; fill: #202124; }} .scale {{ font-size: 11px; fill: #5f6368; }}
.tick {{ font-size: 11px; fill: #5f6368; }}
</style></head><body><svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 4}">
{"".join(ticks)}{"".join(rows)}</svg></body></html>"""
    _render(page, output, y + 4)


def _track(name: str, points: list[tuple[float, float]], y: int, start: float, end: float) -> str:
    scale = 1024**3 if name == "memory_used" else 1.0
    values = [value / scale for _, value in points]
    top = max(*values, 1e-9)
    span = max(end - start, 1.0)
    inner = WIDTH - LABEL - 10

    def x(at: float) -> float:
        return LABEL + inner * (at - start) / span

    def level(value: float) -> float:
        return y + TRACK - 4 - (TRACK - 10) * value / top

    # Each value held until the next one (to the trace's end for the last), as Perfetto draws.
    path = [f"M{x(points[0][0]):.1f},{y + TRACK - 4}"]
    for (at, _), value in zip(points, values, strict=True):
        path.append(f"V{level(value):.1f}" if at == points[0][0] else f"H{x(at):.1f}")
        path.append(f"V{level(value):.1f}")
    path.append(f"H{x(end):.1f}V{y + TRACK - 4}Z")
    colour = COLOURS.get(name, "#d93025" if name == "sm_clock" else POD_COLOUR)
    unit = UNITS.get(name, "")
    return (
        f'<line x1="0" y1="{y + TRACK}" x2="{WIDTH}" y2="{y + TRACK}" stroke="#f1f3f4"/>'
        f'<text x="24" y="{y + 21}" class="name">{html.escape(name)}</text>'
        f'<text x="{LABEL - 8}" y="{y + 21}" class="scale" text-anchor="end">'
        f"{top if top > 1e-9 else 0:.4g} {unit}</text>"
        f'<path d="{" ".join(path)}" fill="{colour}" fill-opacity="0.55" stroke="{colour}"/>'
    )


def _render(page: str, output: Path, height: int) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("trace_picture: needs Debian's chromium")
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "trace.html"
        source.write_text(page)
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={scratch}/profile",
                f"--window-size={WIDTH},{height}",
                f"--screenshot={output.resolve()}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
