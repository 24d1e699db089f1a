"""The on-demand GPU trace against a running daemon (`--web.enable-trace`, basic auth on): its
shape, rate and pods' tracks, its values beside /metrics, scrapes answered while it runs, one
trace at a time per GPU, the refusals, the `gpuscope trace` client; and the fallback to polling
on the fake driver, which keeps no sample buffers. In-process parts: tests/test_trace_parts.py."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import bcrypt
import pytest

from exporter.cli import main
from tests.fake_nvml.node import GIB, fake_env, node_state
from tests.helpers import eventually, running_daemon, value

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.helpers import Daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

USER = "perfetto"
PASSWORD = "trace-me"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
FLEET = """\
seed: 7
gpus:
  - model: h100-sxm
    count: 2
pods:
  - {name: trainer-0, namespace: research, containers: [main], gpus: [0]}
  - {name: notebook-ana, namespace: lab, containers: [jupyter], gpus: [1]}
processes:
  - {pid: 4101, gpu: 0, pod: research/trainer-0, memory: 30GiB, pattern: steady, level: 0.9}
"""
COUNTERS = ("utilization", "memory_used", "power", "sm_clock")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    directory = tmp_path_factory.mktemp("trace")
    fleet = directory / "fleet.yaml"
    fleet.write_text(FLEET)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web = directory / "web.yaml"
    web.write_text(f"basic_auth_users: {{{USER}: '{hashed}'}}\n")
    with running_daemon(
        f"--simulate={fleet}",
        "--collect.interval=200ms",
        "--web.enable-trace",
        f"--web.config.file={web}",
    ) as running:
        eventually(
            lambda: running.get("/-/ready")[0] == 200, 20, "the daemon to be ready", every=0.05
        )
        yield running


def traced(daemon: Daemon, query: str) -> tuple[int, str, bytes]:
    status, headers, body = daemon.get(f"/debug/gpu-trace?{query}", AUTH)
    return status, headers.get("Content-Type", ""), body


def began(daemon: Daemon) -> int:
    return sum("a GPU trace began" in line for line in daemon.log_lines)


def by_track(events: list[dict[str, Any]]) -> dict[tuple[int, str], list[tuple[int, float]]]:
    tracks: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "C":
            tracks[event["pid"], event["name"]].append((event["ts"], event["args"]["value"]))
    return tracks


def test_a_trace_while_metrics_are_scraped(daemon: Daemon) -> None:
    """Two seconds of both GPUs: metadata naming each GPU, every counter at 10 Hz or more with
    strictly increasing times, the pods' tracks (0 for the holder running nothing), values
    beside the /metrics scraped meanwhile (every scrape answered), and a second trace of a GPU
    being traced refused."""
    seconds = 2
    answer: list[tuple[int, str, bytes]] = []
    before = began(daemon)
    tracing = threading.Thread(target=lambda: answer.append(traced(daemon, f"seconds={seconds}")))
    tracing.start()
    eventually(lambda: began(daemon) > before, 10, "the trace to begin", every=0.02)
    status, _, body = traced(daemon, "seconds=1&gpu=0")
    assert status == 409
    assert body.decode().count("\n") == 1
    assert "being traced already" in body.decode()
    scrapes: list[str] = []
    while tracing.is_alive():
        status, _, text = daemon.get("/metrics", AUTH)
        assert status == 200
        scrapes.append(text.decode())
        time.sleep(0.1)  # a scrape every 100 ms, not a wait for time to pass
    tracing.join()
    ((status, content_type, body),) = answer
    assert status == 200, body
    assert content_type == "application/json"
    assert len(scrapes) >= 5
    events = json.loads(body)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert all(e["ph"] == "M" for e in events if e["name"] == "process_name")
    metrics = scrapes[len(scrapes) // 2]
    tracks = by_track(events)
    for gpu in ("0", "1"):
        uuid = next(
            line.split('uuid="')[1].split('"')[0]
            for line in metrics.splitlines()
            if line.startswith("gpu_info{") and f'gpu="{gpu}"' in line
        )
        pid = next(pid for pid, name in names.items() if uuid in name)
        assert f"GPU {gpu} " in names[pid]
        for counter in COUNTERS:
            points = tracks[pid, counter]
            assert len(points) >= 9 * seconds, (counter, len(points))
            times = [at for at, _ in points]
            assert times == sorted(set(times)), f"{counter}: times not strictly increasing"
        expected = {
            "utilization": value(metrics, "gpu_utilization_ratio", gpu=gpu) * 100,
            "memory_used": value(metrics, "gpu_memory_used_bytes", gpu=gpu),
            "power": value(metrics, "gpu_power_watts", gpu=gpu),
            "sm_clock": value(metrics, "gpu_clock_hertz", gpu=gpu, clock="sm") / 1e6,
        }
        for counter, wanted in expected.items():
            values = [number for _, number in tracks[pid, counter]]
            # The steady load changes nothing between the two reads but the power's last watt.
            assert min(values) - 1 <= wanted <= max(values) + 1, (gpu, counter, wanted, values)
    trainer = next(pid for pid, name in names.items() if "GPU 0 " in name)
    notebook = next(pid for pid, name in names.items() if "GPU 1 " in name)
    trainer_values = [number for _, number in tracks[trainer, "research/trainer-0"]]
    assert trainer_values
    # The pods' tracks are the snapshots' values: the one scraped mid-trace among them.
    assert value(metrics, "gpu_pod_utilization_ratio", pod="trainer-0") in trainer_values
    assert [number for _, number in tracks[notebook, "lab/notebook-ana"]]
    assert {number for _, number in tracks[notebook, "lab/notebook-ana"]} == {0.0}
    assert not tracks[trainer, "lab/notebook-ana"]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", "missing seconds=N"),
        ("seconds=0", "an integer from 1 to 60, not '0'"),
        ("seconds=61", "not '61'"),
        ("seconds=1.5", "not '1.5'"),
        ("seconds=1&seconds=2", "seconds given twice"),
        ("seconds=1&gpu=7", "no GPU '7' on this node"),
        ("seconds=1&gpu=GPU-00000000-0000-0000-0000-000000000000", "no GPU 'GPU-0000"),
        ("seconds=1&format=json", "unknown parameter 'format'"),
        ("seconds", "malformed query"),
    ],
)
def test_bad_requests_are_refused_in_one_line(daemon: Daemon, query: str, reason: str) -> None:
    status, _, body = traced(daemon, query)
    assert status == 400
    text = body.decode()
    assert reason in text
    assert text.count("\n") == 1


def test_credentials_are_required(daemon: Daemon) -> None:
    status, _, _ = daemon.get("/debug/gpu-trace?seconds=1")
    assert status == 401


def test_the_client_saves_a_trace(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    output = tmp_path / "trace.json"
    login = ["--username", USER, "--password-file", str(password)]
    status = main(
        ["trace", "--seconds", "1", "--gpu", "1", "--output", str(output), *login, daemon.url]
    )
    assert status == 0, capsys.readouterr().err
    events = json.loads(output.read_text())["traceEvents"]
    assert [
        e["args"]["name"].split()[:2] for e in events if e["ph"] == "M" and "name" in e["args"]
    ] == [["GPU", "1"]]
    assert str(output) in capsys.readouterr().out

    assert (
        main(["trace", "--seconds", "1", "--gpu", "7", "--output", str(output), *login, daemon.url])
        == 1
    )
    error = capsys.readouterr().err
    assert "answered 400: no GPU '7' on this node" in error
    assert error.count("\n") == 1

    assert main(["trace", "--seconds", "1", daemon.url]) == 1
    assert "answered 401" in capsys.readouterr().err

    assert main(["trace", "--seconds", "1", "http://127.0.0.1:9"]) == 1  # discard: nobody listens
    error = capsys.readouterr().err
    assert error.startswith(
        "gpuscope trace: error: cannot reach http://127.0.0.1:9/debug/gpu-trace"
    )
    assert error.count("\n") == 1

    with pytest.raises(SystemExit) as refused:
        main(["trace", "--seconds", "0", daemon.url])
    assert refused.value.code == 2
    assert "--seconds: an integer from 1 to 60, not '0'" in capsys.readouterr().err


def test_polls_a_driver_without_sample_buffers(fake_lib_dir: Path, tmp_path: Path) -> None:
    """The fake libnvidia-ml.so.1 has no nvmlDeviceGetSamples (pynvml: FunctionNotFound): every
    counter is polled on the GPU's worker, at 10 Hz or more, with the driver's values."""
    state = node_state().write(tmp_path / "state")
    with running_daemon(
        "--collect.interval=10m", "--web.enable-trace", env=fake_env(fake_lib_dir, state)
    ) as daemon:
        daemon.wait_ready()
        status, _, body = daemon.get("/debug/gpu-trace?seconds=1&gpu=0")
    assert status == 200, body
    tracks = by_track(json.loads(body)["traceEvents"])
    fixed = {"utilization": 37.0, "memory_used": 30.0 * GIB, "power": 412.5, "sm_clock": 1755.0}
    for counter, wanted in fixed.items():
        points = tracks[1, counter]
        assert len(points) >= 9, (counter, len(points))
        assert {number for _, number in points} == {wanted}
