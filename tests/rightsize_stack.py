"""`gpuscope rightsize serve` as a user runs it: known history backfilled into a real Prometheus
that scrapes the server, and the server itself as a subprocess. Shared by the server's tests,
`scripts/try-rightsize serve` and `benchmarks/rightsize.py`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.helpers import ROOT, eventually, require_tool
from tests.rightsize_scenario import CALIBRATION, END, WORKLOADS
from tests.synthetic_history import backfill, write_openmetrics

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from tests.synthetic_history import FakeWorkload

COMMAND = (sys.executable, "-m", "exporter", "rightsize", "serve")
DAY = 86400


def history(root: Path, workloads: Sequence[FakeWorkload] = WORKLOADS) -> Path:
    """14 days (and an hour) of the workloads' history, scraped every 2 minutes and backfilled
    with promtool into `root/data`; the data directory."""
    openmetrics = root / "history.om"
    with openmetrics.open("w") as out:
        write_openmetrics(
            out,
            list(workloads),
            end=END,
            duration=14 * DAY + 3600,
            interval=120,
            calibration=CALIBRATION,
        )
    backfill(require_tool("promtool"), openmetrics, root / "data")
    openmetrics.unlink()
    return root / "data"


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: bytearray = field(default_factory=bytearray)
    """Its standard error (the log), every byte kept."""

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def json(self, path: str) -> dict[str, object]:
        status, body = self.get(path)
        assert status == 200, body
        document: dict[str, object] = json.loads(body)
        return document

    def text(self) -> str:
        return self.log.decode(errors="replace")


@contextlib.contextmanager
def serving(
    prometheus: str,
    port: int,
    *args: str,
    ready_timeout: float = 120.0,
    env: dict[str, str] | None = None,
    end: int = END,
) -> Iterator[Server]:
    """`gpuscope rightsize serve` against `prometheus` on 127.0.0.1:`port` for `end` (the
    scenario's), until its first report is ready (or its first refresh failed, with `--refresh` and a
    broken Prometheus: then `/-/healthy` answers); stopped with SIGTERM afterwards."""
    process = subprocess.Popen(
        [
            *COMMAND,
            f"--prometheus={prometheus}",
            f"--end={end}",
            f"--web.listen-address=127.0.0.1:{port}",
            *args,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    server = Server(process, f"http://127.0.0.1:{port}")

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            server.log += line

    reader = threading.Thread(target=pump, name="rightsize-serve-log", daemon=True)
    reader.start()
    try:

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the server exited {process.returncode}:\n{server.text()}")
            return "report refreshed" in server.text() or "refresh failed" in server.text()

        eventually(up, ready_timeout, "the server's first refresh", detail=server.text)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)
