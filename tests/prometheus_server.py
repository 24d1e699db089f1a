"""A real Prometheus on loopback over a data directory (e.g. backfilled history)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from tests.helpers import require_tool

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_prometheus(
    data_dir: Path,
    *,
    retention: str = "400d",
    ready_timeout: float = 90.0,
    scrape: tuple[str, float] | None = None,
    receive: bool = False,
    rules: Path | None = None,
) -> Iterator[str]:
    """`prometheus` serving `data_dir` on a free loopback port; yields its base URL.

    Retention counts back from the newest block, so backfilled history stays whatever its date.
    `scrape` is a (host:port, interval in seconds) it scrapes `/metrics` of, as job `target`.
    `receive` accepts remote write (`/api/v1/write`), samples of the last 30 days too, inside
    the time its blocks already cover (as vmalert's replay of rules writes them). `rules` is a
    rule file it evaluates, every scrape interval (with `scrape`).
    """
    binary = require_tool("prometheus")
    config = data_dir.parent / f"{data_dir.name}-prometheus.yml"
    storage = "storage:\n  tsdb:\n    out_of_order_time_window: 30d\n" if receive else ""
    if scrape is None:
        config.write_text(f"global:\n  scrape_interval: 1m\nscrape_configs: []\n{storage}")
    else:
        target, interval = scrape
        rule_files = f"rule_files: ['{rules}']\n" if rules is not None else ""
        config.write_text(
            f"global:\n  scrape_interval: {interval:g}s\n  scrape_timeout: {interval:g}s\n"
            f"  evaluation_interval: {interval:g}s\n{rule_files}"
            f"scrape_configs:\n  - job_name: target\n    static_configs:\n"
            f"      - targets: ['{target}']\n{storage}"
        )
    port = free_port()
    log = (data_dir.parent / f"{data_dir.name}-prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.retention.time={retention}",
            "--log.level=warn",
            *(["--web.enable-remote-write-receiver"] if receive else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None:
                raise AssertionError(f"prometheus exited with {process.returncode}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response,
            ):
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready after {ready_timeout}s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
