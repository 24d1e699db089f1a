"""The HTML report's picture of the policy replay: one GPUs line per policy replayed (`current`
per step, the others flat at their placement's GPUs) and the busy GPU-equivalents they carry,
every value read back from the SVG's coordinates and recomputed from the report's JSON."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

import pytest

from exporter.catalog import builtin_catalog
from exporter.rightsize.formatters import FORMATTERS, Output
from exporter.rightsize.hardware import Option
from exporter.rightsize.replay.engine import CurrentSteps, Workload, replay
from exporter.rightsize.settings import StrategySettings
from tests.rightsize_data import (
    GIB,
    REPLAY_PERIOD,
    hardware,
    sample_report,
    sample_simulation,
)

pytestmark = pytest.mark.timeout(60)

SVG = "{http://www.w3.org/2000/svg}"
POLICIES = ("current", "exclusive", "mig", "timeslice", "binpack")


def _chart(page: str) -> ET.Element:
    figure = page.index('<figure class="replay">')
    start = page.index("<svg", figure)
    end = page.index("</svg>", start) + len("</svg>")
    return ET.fromstring(page[start:end])


def _scale(svg: ET.Element) -> tuple[float, float]:
    """GPUs per pixel and the baseline's pixel, from the first and last ticks of the GPUs axis."""
    ticks = [float(line.attrib["y1"]) for line in svg.iter(f"{SVG}line") if line.get("class")]
    labels = [float(text.text or "") for text in svg.iter(f"{SVG}text") if text.get("class")]
    assert len(ticks) == len(labels) >= 2
    per_pixel = (labels[-1] - labels[0]) / (ticks[0] - ticks[-1])
    return per_pixel, ticks[0] + labels[0] / per_pixel


def _lines(svg: ET.Element) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    per_pixel, baseline = _scale(svg)
    found = []
    for line in svg.iter(f"{SVG}polyline"):
        points = [tuple(map(float, pair.split(","))) for pair in line.attrib["points"].split()]
        found.append(
            (line.attrib, [(x, (baseline - y) * per_pixel) for x, y in points])  # type: ignore[misc]
        )
    return found


def _nearest_rank(values: list[float], quantile: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


def _page(policies: tuple[str, ...] = POLICIES, **changes: Any) -> tuple[str, dict[str, Any]]:
    report = replace(sample_report(), simulation=sample_simulation(policies), **changes)
    document = json.loads(FORMATTERS["json"](report, Output()))
    return FORMATTERS["html"](report, Output()), {e["policy"]: e for e in document["simulation"]}


def test_one_gpus_line_per_policy_with_the_jsons_figures() -> None:
    page, simulation = _page()
    lines = _lines(_chart(page))
    gpus = {
        attrib["data-policy"]: values for attrib, values in lines if attrib["data-series"] == "gpus"
    }
    assert sorted(gpus) == sorted(POLICIES)
    assert len(lines) - len(gpus) >= 1  # and the demand under them
    steps = 2 * REPLAY_PERIOD
    held = [value for _, value in gpus["current"]]
    assert len(held) == steps
    assert held[0] == pytest.approx(8, abs=0.02)
    assert held[-1] == pytest.approx(6, abs=0.02)
    current = simulation["current"]["gpus"]
    assert max(held) == pytest.approx(current["max"], abs=0.02)
    assert _nearest_rank(held, 0.5) == pytest.approx(current["p50"], abs=0.02)
    assert _nearest_rank(held, 0.95) == pytest.approx(current["p95"], abs=0.02)
    xs = [x for x, _ in gpus["current"]]
    assert xs == sorted(xs)
    for policy in POLICIES[1:]:
        # A fixed placement: the same GPUs over the whole window, drawn from end to end.
        flat = gpus[policy]
        assert [x for x, _ in flat] == pytest.approx([xs[0], xs[-1]], abs=0.1)
        for _, value in flat:
            assert value == pytest.approx(simulation[policy]["gpus"]["max"], abs=0.02), policy
    assert {simulation[p]["gpus"]["max"] for p in POLICIES} == {8, 4, 3}


def test_the_busy_line_is_the_demand_each_policy_carries() -> None:
    """Mean busy over mean GPUs is each policy's utilization in the JSON."""
    page, simulation = _page()
    lines = _lines(_chart(page))
    gpus = {a["data-policy"]: v for a, v in lines if a["data-series"] == "gpus"}
    carried = {}
    for attrib, values in lines:
        if attrib["data-series"] == "busy":
            assert len(values) == 2 * REPLAY_PERIOD
            for policy in attrib["data-policies"].split():
                carried[policy] = [value for _, value in values]
    assert sorted(carried) == sorted(POLICIES)
    # Every policy keeps the services on their A100s: one demand, 0.15 x 7 + 0.39 at each step.
    assert len([a for a, _ in lines if a["data-series"] == "busy"]) == 1
    for value in carried["current"]:
        assert value == pytest.approx(0.39 + 7 * 0.15, abs=0.02)
    for policy, busy in carried.items():
        held = [value for _, value in gpus[policy]]
        mean_held = sum(held) / len(held) if policy == "current" else held[0]
        utilization = sum(busy) / len(busy) / mean_held
        assert utilization == pytest.approx(simulation[policy]["utilization_mean"], abs=0.005)


def test_the_axes_name_the_windows_dates_and_the_legend_each_policy() -> None:
    page, _ = _page()
    svg = _chart(page)
    texts = [text.text or "" for text in svg.iter(f"{SVG}text")]
    assert "time (UTC)" in texts
    assert "GPUs" in texts
    assert any(re.fullmatch(r"[A-Z][a-z]{2} \d\d( \d\d:\d\d)?", text) for text in texts)
    for policy in POLICIES:
        assert any(text.startswith(f"{policy}: ") for text in texts), policy
    caption = page[page.index("<figcaption") : page.index("</figcaption>")]
    assert "time-slicing the serving workloads: 8 → 3 A100 80GB SXM GPUs" in caption


def test_without_simulate_the_page_has_no_replay() -> None:
    page = FORMATTERS["html"](sample_report(), Output())
    assert "Policy replay" not in page
    assert "data-series" not in page


def test_what_is_not_drawn_is_said() -> None:
    page, _ = _page(("timeslice", "binpack"))
    assert "current was not replayed: add it to --simulate" in page
    assert {a["data-policy"] for a, _ in _lines(_chart(page)) if a["data-series"] == "gpus"} == {
        "timeslice",
        "binpack",
    }
    unpriced = tuple(
        replace(result, cost_usd_per_month=None) if result.policy == "mig" else result
        for result in sample_simulation()
    )
    page = FORMATTERS["html"](replace(sample_report(), simulation=unpriced), Output())
    assert "mig is unpriced: a GPU model it uses has no price" in page
    failed = replace(sample_report(), missing_signals=("replay",))
    page = FORMATTERS["html"](failed, Output())
    assert "The policy replay has no result" in page


def test_a_policy_moving_workloads_to_another_model_gets_a_busy_line_of_its_own() -> None:
    """Four services at 5% of an A100: exclusive moves each to an L4, where the same work is a
    larger share of a GPU; timeslice keeps them on one A100 and carries current's demand."""
    a100 = builtin_catalog().find("a100-sxm4-80gb")
    assert a100 is not None
    services = [
        Workload("", "serving", "Deployment", f"svc-{n}", Option(a100), (0.05,) * 10, 5 * GIB)
        for n in range(4)
    ]
    results = replay(
        services,
        CurrentSteps((4.0,) * 10, {"a100-sxm4-80gb": 40.0}, 0),
        hardware=hardware(),
        settings=StrategySettings(models=("a100-sxm4-80gb", "l4")),
        policies=("current", "exclusive", "timeslice"),
    )
    report = replace(sample_report(), simulation=results)
    simulation = {
        e["policy"]: e for e in json.loads(FORMATTERS["json"](report, Output()))["simulation"]
    }
    assert {p["gpu_model"] for p in simulation["exclusive"]["placements"]} == {"L4"}
    page = FORMATTERS["html"](report, Output())
    busy = {
        attrib["data-policies"]: [value for _, value in values]
        for attrib, values in _lines(_chart(page))
        if attrib["data-series"] == "busy"
    }
    assert set(busy) == {"current timeslice", "exclusive"}
    assert busy["current timeslice"] == pytest.approx([0.2] * 10, abs=0.01)
    # Mean busy over its 4 L4s is the utilization the JSON gives it.
    assert sum(busy["exclusive"]) / 10 / 4 == pytest.approx(
        simulation["exclusive"]["utilization_mean"], abs=0.005
    )
    assert "busy, on the models of" in page


def test_a_replay_that_placed_nothing_says_so() -> None:
    empty = tuple(replace(result, placements=()) for result in sample_simulation())
    page = FORMATTERS["html"](replace(sample_report(), simulation=empty), Output())
    assert "the policies placed nothing" in page
