"""A PromQL API stand-in that answers `gpuscope rightsize`'s queries about a few workloads, and
can be made hostile: a signal's answer tampered with (a negative value, 1e308, NaN, a deeply
nested element), every per-pod batch answered with every pod's series, queries refused as
Prometheus refuses a string with a raw control character in it. Shared by the hostile tests and
`benchmarks/hostile_prometheus.py`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from exporter.rightsize.selection import promql_string

if TYPE_CHECKING:
    from collections.abc import Callable

WINDOW = 14 * 86400
STEP = 300
END = 1_780_000_200
GIB = 1024**3

SIGNATURES = (
    ("held", "count_over_time(gpu_allocation_info"),
    ("present", "timestamp(gpu_allocation_info"),
    ("in_use", "gpu_allocation_in_use"),
    ("busy_steps", "count_over_time(rate(gpu_pod_busy_seconds_total"),
    ("busy_seconds", "increase(gpu_pod_busy_seconds_total"),
    ("busy_idle_quantile", "quantile_over_time(0.99, rate(gpu_pod_busy_seconds_total"),
    ("busy_quantile", "rate(gpu_pod_busy_seconds_total"),
    ("memory_quantile", "quantile_over_time(0.99, gpu_pod_memory_used_bytes"),
    ("memory_peak", "max_over_time(gpu_pod_memory_used_bytes"),
    ("cpu_usage_quantile", "container_cpu_usage_seconds_total"),
    ("cpu_limit", "kube_pod_container_resource_limits"),
)
"""How the stand-in tells the job's queries apart: the first signature the query holds."""


def device_values(window: int) -> dict[str, float]:
    """Each device signal's value over a window (the whole one or a shorter term)."""
    return {
        "held": window // STEP + 1,
        "present": END,
        "in_use": 1.0,
        "busy_steps": window // STEP + 1,
        "busy_seconds": 0.5 * window,
        "busy_quantile": 0.5,
        "busy_idle_quantile": 0.6,
        "memory_peak": 10 * GIB,
        "memory_quantile": 9 * GIB,
    }


def window_of(query: str) -> int:
    """The window a query asks over (`[14d:5m]`, `[1d]`)."""
    found = re.search(r"\[(\d+)d[]:]", query)
    return int(found[1]) * 86400 if found else WINDOW


CPU_VALUES = {"cpu_usage_quantile": 1.5, "cpu_limit": 4.0}


def held_pod(workload: str, number: int = 0, *, namespace: str = "team") -> dict[str, str]:
    """The labels `gpu_allocation_info` has for one pod of a Deployment holding one L4."""
    return {
        "namespace": namespace,
        "workload_kind": "Deployment",
        "workload": workload,
        "pod": f"{workload}-7d9f8-{number:05d}",
        "uuid": f"GPU-{workload}-{number:05d}",
        "container": "main",
        "model": "NVIDIA L4",
        "resource": "nvidia.com/gpu",
    }


def pods_asked(query: str) -> set[str]:
    """The alternatives of a per-pod query's `pod=~"..."` matcher, as written in it."""
    found = re.search(r'pod=~"((?:[^"\\]|\\.)*)"', query)
    return set(re.split(r"(?<!\\)\|", found[1])) if found else set()


def signal_of(query: str) -> str | None:
    return next((name for name, mark in SIGNATURES if mark in query), None)


@dataclass
class StandIn:
    """The stand-in's script: the pods holding GPUs, and how it misbehaves."""

    pods: list[dict[str, str]]
    tamper: dict[str, Callable[[list[dict[str, Any]]], str]] = field(default_factory=dict)
    """Signal name -> the JSON text of its `result` array, made from the honest elements."""
    every_series: bool = False
    """Answer each per-pod query with every pod's series, whichever it asked about."""
    strict_strings: bool = True
    """Refuse a query holding a raw control character, as PromQL refuses one in a string."""
    queries: list[str] = field(default_factory=list)

    def elements(self, signal: str | None, query: str) -> list[dict[str, Any]]:
        values = device_values(window_of(query))
        if signal == "held":
            steps = str(values["held"])
            return [{"metric": dict(pod), "value": [END, steps]} for pod in self.pods]
        if signal in values:
            keys = ("namespace", "workload_kind", "workload", "pod", "uuid")
            value = str(values[signal])
            return [
                {"metric": {key: pod[key] for key in keys}, "value": [END, value]}
                for pod in self.pods
            ]
        if signal in CPU_VALUES:
            value = str(CPU_VALUES[signal])
            asked = set() if self.every_series else pods_asked(query)
            return [
                {
                    "metric": {
                        "namespace": pod["namespace"],
                        "pod": pod["pod"],
                        "container": "main",
                    },
                    "value": [END, value],
                }
                for pod in self.pods
                if self.every_series or promql_string(re.escape(pod["pod"])) in asked
            ]
        if query == "vector(1)":
            return [{"metric": {}, "value": [END, "1"]}]
        return []

    async def handle(self, request: web.Request) -> web.Response:
        query = str((await request.post())["query"])
        self.queries.append(query)
        if self.strict_strings and any(ord(char) < 0x20 for char in query):
            return web.json_response(
                {
                    "status": "error",
                    "errorType": "bad_data",
                    "error": "1:80: parse error: unterminated quoted string",
                },
                status=400,
            )
        signal = signal_of(query)
        elements = self.elements(signal, query)
        result = (
            self.tamper[signal](elements)
            if signal in self.tamper and signal is not None
            else json.dumps(elements)
        )
        text = '{"status":"success","data":{"resultType":"vector","result":' + result + "}}"
        return web.Response(text=text, content_type="application/json")


def with_value(workload: str, value: str) -> Callable[[list[dict[str, Any]]], str]:
    """A tamper: the elements of `workload` carry `value`."""

    def tamper(elements: list[dict[str, Any]]) -> str:
        for element in elements:
            if element["metric"].get("workload") == workload:
                element["value"] = [END, value]
        return json.dumps(elements)

    return tamper


def with_nested_element(depth: int) -> Callable[[list[dict[str, Any]]], str]:
    """A tamper: an element `depth` arrays deep among the honest ones."""

    def tamper(elements: list[dict[str, Any]]) -> str:
        honest = json.dumps(elements)
        return honest[:-1] + ("," if elements else "") + "[" * depth + "]" * depth + "]"

    return tamper


def idle(workload: str) -> dict[str, Callable[[list[dict[str, Any]]], str]]:
    """Tampers making `workload` an idle holder (honestly so): a change, hence a patch."""
    return {
        signal: with_value(workload, "0")
        for signal in (
            "in_use",
            "busy_seconds",
            "busy_quantile",
            "busy_idle_quantile",
            "memory_peak",
            "memory_quantile",
        )
    }
