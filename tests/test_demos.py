"""Each demo script the README names, as a newcomer runs it on a fresh clone: it installs what it
needs into the clone's own `.venv`, starts, serves, and stops (Ctrl-C) — so that no demo can rot
without the suite saying so.

The clone is the working tree's files as `git clone` would give them (tracked and new files, not
ignored ones), so there is no `.venv` until the first script makes one: `scripts/try` installs
the core package alone, then `scripts/try-rightsize` and `scripts/try-serving` add the `demos`
extra to it, as a user running them in that order would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest

from tests.helpers import ROOT, eventually, require_tool
from tests.prometheus_server import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INSTALL_SECONDS = 600
"""A fresh venv and the demos' extra (matplotlib, numpy, the Kubernetes client...) from pip's
cache on a loaded machine; every later wait is for the demo itself."""


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for tool in ("git", "promtool", "prometheus"):
        require_tool(tool)
    root = tmp_path_factory.mktemp("fresh-clone")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in a commit
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return root


def environment() -> dict[str, str]:
    """The user's environment, without this test run's virtualenv or gpuscope settings; pip
    does not byte-compile what it installs (the demos import a fraction of the packages, which
    Python compiles as it imports them: what runs is the same, the install is quicker)."""
    return {
        **{
            key: value
            for key, value in os.environ.items()
            if key not in {"VIRTUAL_ENV", "PYTHONPATH", "KUBECONFIG"}
            and not key.startswith("GPUSCOPE_")
        },
        "PIP_NO_COMPILE": "1",
    }


class Running:
    """A demo script in the background, its output lines collected as they come."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        # With Ctrl-C's default handling, as a terminal's foreground job has it: a test run
        # started in the background (`&` in a script, as CI may) ignores SIGINT, which its
        # children inherit — and a Python program that starts with SIGINT ignored never
        # raises KeyboardInterrupt.
        self.process = subprocess.Popen(
            ["env", "--default-signal=INT", *command],
            cwd=cwd,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def said(self, start: str) -> str | None:
        return next((line for line in self.lines if line.startswith(start)), None)

    def wait_for(self, start: str, timeout: float) -> str:
        def seen() -> str | None:
            if self.process.poll() is not None and self.said(start) is None:
                raise AssertionError(f"it ended ({self.process.returncode}):\n{self.output()}")
            return self.said(start)

        return eventually(seen, timeout, f"{start!r} in its output", every=0.5, detail=self.output)

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C, as a user stops it (the terminal signals the whole process group: the
        script and what it started); its exit status."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise AssertionError(
                f"still running {timeout}s after Ctrl-C:\n{self.output()}"
            ) from None

    def output(self) -> str:
        return "\n".join(self.lines[-60:])


@pytest.fixture
def running(clone: Path) -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for demo in started:
        if demo.process.poll() is None:
            os.killpg(demo.process.pid, signal.SIGKILL)
            demo.process.wait(10)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_scripts_try_with_only_flags_keeps_the_fleet_and_names_its_address(
    clone: Path, running: list[Running]
) -> None:
    port = free_port()
    demo = Running([str(clone / "scripts" / "try"), "--web.listen-address", f":{port}"], clone)
    running.append(demo)
    banner = demo.wait_for("gpuscope: serving", INSTALL_SECONDS)
    assert banner == (
        f"gpuscope: serving simulated GPUs on http://localhost:{port}/metrics (Ctrl-C stops)"
    )

    def fleet() -> str | None:
        try:
            metrics = get(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return None
        return metrics if "gpu_pod_info{" in metrics else None

    metrics = eventually(fleet, 60, "the example fleet's pods on /metrics", detail=demo.output)
    assert 'pod="llm-pretrain-0"' in metrics, "examples/fleet.yaml's pods"
    assert 'label_team="llm"' in metrics, "--kubernetes.pod-labels=team kept"
    assert demo.interrupt() == 0


def test_scripts_try_rightsize_writes_the_report(clone: Path) -> None:
    result = subprocess.run(
        [str(clone / "scripts" / "try-rightsize")],
        cwd=clone,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS + 240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "try-rightsize: wrote report.html" in result.stderr
    assert "<html" in (clone / "report.html").read_text(encoding="utf-8")
    assert "GPU rightsizing" in result.stdout


def test_scripts_try_rightsize_from_dcgm_exporter_history(clone: Path) -> None:
    result = subprocess.run(
        [str(clone / "scripts" / "try-rightsize"), "--source", "dcgm-exporter", "--format=json"],
        cwd=clone,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS + 240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "dcgm-exporter and kube-state-metrics history (no gpuscope series)" in result.stderr
    assert "try-rightsize: wrote report.html" in result.stderr
    document = json.loads(result.stdout)
    assert document["history_source"] == "dcgm-exporter"
    recommended = {(w["workload"], w["recommended"]) for w in document["workloads"]}
    assert {("notebook", "release"), ("finetune", "H100 SXM x1")} <= recommended


def test_scripts_try_serving_serves_until_ctrl_c(clone: Path, running: list[Running]) -> None:
    demo = Running([str(clone / "scripts" / "try-serving")], clone)
    running.append(demo)
    ready = demo.wait_for("Prometheus with gpuscope's rules: ", INSTALL_SECONDS + 240)
    prometheus = ready.split("rules: ")[1].split()[0]
    node = ready.split("gpuscope: ")[1].rstrip(")")
    assert "gpu_up{" in get(node)
    assert get(f"{prometheus}/-/ready")
    assert demo.interrupt() == 0
    assert demo.said("try-serving: stopping")
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        get(node)  # the stack stopped with it
