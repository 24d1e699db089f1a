"""Stand-in inference servers for the serving tests and the serving demo: what vLLM, SGLang,
Hugging Face TGI and NVIDIA Triton export on `/metrics`, counting at steady rates.

Each `ServedPod` is one server (one port on loopback) of a pod, in that server's own exposition:
vLLM's `vllm:*_total` counters by `model_name` and `engine` (requests by `finished_reason`),
SGLang's `sglang:*_total` by `model_name`, TGI's `tgi_request_*` histograms and
`tgi_request_success` without a model label, Triton's `nv_inference_*` counters by `model` and
`version` (no `_total`, no tokens). A counter's value at time t is its rate times (t - `since`),
computed when scraped, so `rate()` over any window of a scrape is the configured rate.

`history_openmetrics` writes the same counters from `since` up to a time as OpenMetrics for
`promtool tsdb create-blocks-from openmetrics`, with the labels a scrape would add (`job`,
`instance` and the pod's `namespace` and `pod`): backfilled into a Prometheus that then scrapes
the servers, a 5-minute `rate()` is exact from the first scrape on. `ServingStack` is the live
stack of dashboards/live.py with the servers scraped as job `serving` the way a PodMonitor
scrapes them (target labels `namespace` and `pod`), their history backfilled first.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from dashboards.live import LiveStack, free_port
from tests.helpers import FLEETS
from tests.synthetic_history import backfill

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TextIO

SERVING_JOB: Final = "serving"
FAMILIES: Final = {
    "vllm": (
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
    ),
    "sglang": (
        "sglang:generation_tokens_total",
        "sglang:prompt_tokens_total",
        "sglang:num_requests_total",
    ),
    "tgi": (
        "tgi_request_generated_tokens_sum",
        "tgi_request_input_length_sum",
        "tgi_request_success",
    ),
    "triton": ("nv_inference_request_success", "nv_inference_count"),
}
"""The counters each server exports here, as Prometheus stores them (what the rules read)."""
HISTORY_STEP_SECONDS: Final = 5.0
_HISTOGRAMS: Final = frozenset({"tgi_request_generated_tokens", "tgi_request_input_length"})


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    """vLLM's and SGLang's `model_name`, Triton's `model`; TGI exports none."""
    output_tokens: float = 0.0
    """Per second; also Triton's inferences (`nv_inference_count`, batch items)."""
    prompt_tokens: float = 0.0
    requests: float = 0.0
    """Successful requests per second."""
    version: str = "1"
    """Triton's `version`."""


@dataclass(frozen=True, slots=True)
class ServedPod:
    namespace: str
    pod: str
    server: str
    """One of FAMILIES: vllm, sglang, tgi, triton."""
    models: tuple[ServedModel, ...]


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def samples(served: ServedPod, elapsed: float) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each counter after `elapsed` seconds of serving."""
    found: list[tuple[str, dict[str, str], float]] = []
    for model in served.models:
        output = model.output_tokens * elapsed
        prompt = model.prompt_tokens * elapsed
        requests = model.requests * elapsed
        match served.server:
            case "vllm":
                base = {"engine": "0", "model_name": model.name}
                found += [
                    ("vllm:generation_tokens_total", base, output),
                    ("vllm:prompt_tokens_total", base, prompt),
                    ("vllm:request_success_total", {**base, "finished_reason": "stop"}, requests),
                    ("vllm:request_success_total", {**base, "finished_reason": "abort"}, 0.0),
                ]
            case "sglang":
                base = {"engine_type": "unified", "model_name": model.name, "tp_rank": "0"}
                found += [
                    ("sglang:generation_tokens_total", base, output),
                    ("sglang:prompt_tokens_total", base, prompt),
                    ("sglang:num_requests_total", base, requests),
                ]
            case "tgi":
                for family, total in (
                    ("tgi_request_generated_tokens", output),
                    ("tgi_request_input_length", prompt),
                ):
                    found += [
                        (f"{family}_bucket", {"le": "+Inf"}, requests),
                        (f"{family}_sum", {}, total),
                        (f"{family}_count", {}, requests),
                    ]
                found.append(("tgi_request_success", {}, requests))
            case "triton":
                base = {"model": model.name, "version": model.version}
                found += [
                    ("nv_inference_request_success", base, requests),
                    ("nv_inference_count", base, output),
                ]
            case other:
                raise ValueError(f"no such server: {other}")
    return found


def exposition(served: ServedPod, elapsed: float) -> str:
    """The Prometheus text format the server answers `/metrics` with."""
    lines: list[str] = []
    typed: set[str] = set()
    for name, labels, value in samples(served, elapsed):
        base, _, suffix = name.rpartition("_")
        family = base if base in _HISTOGRAMS and suffix in {"bucket", "sum", "count"} else name
        if family not in typed:
            typed.add(family)
            lines.append(f"# TYPE {family} {'histogram' if family in _HISTOGRAMS else 'counter'}")
        lines.append(f"{name}{_labels(labels) if labels else ''} {value:.6f}")
    return "\n".join(lines) + "\n"


class StandInServers:
    """Every `ServedPod` on a loopback port of its own, in a thread with its own event loop;
    `since` is when their counters started (Unix time)."""

    def __init__(self, pods: Sequence[ServedPod], since: float) -> None:
        self.pods = tuple(pods)
        self.since = since
        self.ports: dict[ServedPod, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> StandInServers:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def target(self, served: ServedPod) -> str:
        return f"127.0.0.1:{self.ports[served]}"

    async def _listen(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        for served in self.pods:
            port = free_port()
            await web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True).start()
            self.ports[served] = port

    async def _shut(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        served = next(pod for pod, listening in self.ports.items() if listening == port)
        text = exposition(served, time.time() - self.since)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")


def history_openmetrics(out: TextIO, servers: StandInServers, until: float) -> None:
    """Each server's counters every HISTORY_STEP_SECONDS from `servers.since` to before `until`,
    with the labels its scrape adds, as OpenMetrics (every family `unknown`: OpenMetrics counters
    must end in `_total`, Triton's and TGI's do not)."""
    rows: dict[str, list[str]] = {}
    steps = int((until - servers.since) / HISTORY_STEP_SECONDS)
    for served in servers.pods:
        target = {
            "job": SERVING_JOB,
            "instance": servers.target(served),
            "namespace": served.namespace,
            "pod": served.pod,
        }
        for step in range(steps):
            elapsed = step * HISTORY_STEP_SECONDS
            for name, labels, value in samples(served, elapsed):
                rows.setdefault(name, []).append(
                    f"{name}{_labels({**labels, **target})} {value:.6f} "
                    f"{servers.since + elapsed:.3f}"
                )
    for name, lines in rows.items():
        out.write(f"# TYPE {name} unknown\n")
        out.write("\n".join(lines) + "\n")
    out.write("# EOF\n")


@dataclass
class ServingStack(LiveStack):
    """The live stack with the stand-in servers scraped as job `serving`, each target carrying
    its pod's `namespace` and `pod`, and `history` seconds of their counters backfilled."""

    served: Sequence[ServedPod] = ()
    history: float = 330.0
    promtool_binary: str = "promtool"
    servers: StandInServers = field(init=False)

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.servers = self._stand_ins.enter_context(
            StandInServers(self.served, since=now - self.history)
        )
        openmetrics = self.workdir / "serving-history.om"
        with openmetrics.open("w", encoding="utf-8") as out:
            history_openmetrics(out, self.servers, now)
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        backfill(self.promtool_binary, openmetrics, data)
        super()._start()

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["scrape_configs"].append(
            {
                "job_name": SERVING_JOB,
                "static_configs": [
                    {
                        "targets": [self.servers.target(served)],
                        "labels": {"namespace": served.namespace, "pod": served.pod},
                    }
                    for served in self.served
                ],
            }
        )
        return config


SERVING_FLEET: Final = FLEETS / "serving.yaml"
SERVED: Final = (
    ServedPod(
        "serving",
        "chat-7c8d9f6b5-p9m2n",
        "vllm",
        (ServedModel("llama-3.1-70b", output_tokens=1200, prompt_tokens=3600, requests=4),),
    ),
    ServedPod(
        "serving",
        "assist-5c8d9f7b6-k4t8p",
        "vllm",
        (ServedModel("llama-3.1-8b", output_tokens=900, prompt_tokens=2400, requests=3),),
    ),
    ServedPod(
        "serving",
        "vision-0",
        "triton",
        (
            ServedModel("resnet50", output_tokens=120, requests=40),
            ServedModel("yolov8", output_tokens=30, requests=15, version="2"),
        ),
    ),
    ServedPod(
        "serving",
        "rerank-0",
        "sglang",
        (ServedModel("bge-reranker", output_tokens=300, prompt_tokens=6000, requests=20),),
    ),
    ServedPod(
        "serving",
        "rerank-1",
        "sglang",
        (ServedModel("bge-reranker", output_tokens=300, prompt_tokens=6000, requests=25),),
    ),
    ServedPod(
        "serving",
        "summarize-cpu-0",
        "tgi",
        (ServedModel("", output_tokens=50, prompt_tokens=400, requests=1),),
    ),
)
"""The servers of tests/fixtures/fleets/serving.yaml's pods, and a TGI server on a pod without a
GPU (gpuscope attributes it nothing: it has no cost per token)."""
