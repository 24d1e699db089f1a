"""Policy replay (`gpuscope rightsize --simulate`): the setting, the placement search on
per-step demand vectors, and the policies over a workload set whose answers are known."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from aiohttp import web

from exporter.catalog import builtin_catalog
from exporter.rightsize.hardware import Hardware, Option
from exporter.rightsize.history import Ceilings
from exporter.rightsize.options import load
from exporter.rightsize.prometheus import Connection, PrometheusClient
from exporter.rightsize.replay import engine, placement, summary
from exporter.rightsize.replay.engine import CurrentSteps, Workload, evaluate, replay
from exporter.rightsize.replay.placement import Item, pack, pack_instances
from exporter.rightsize.replay.policies import POLICIES, parse_policies
from exporter.rightsize.replay.steps import fetch_steps
from exporter.rightsize.selection import Selection
from exporter.rightsize.server import exposition, recommendation_metrics
from exporter.rightsize.settings import StrategySettings
from exporter.settings import ConfigError
from tests.rightsize_data import hardware, sample_report
from tests.rightsize_run import rightsize, serving

pytestmark = pytest.mark.timeout(120)

EMPTY = {"status": "success", "data": {"resultType": "vector", "result": []}}


# -- the setting --------------------------------------------------------------------------------


def test_policies_are_parsed_in_their_order_each_once() -> None:
    assert parse_policies("binpack, current,binpack") == ("current", "binpack")
    assert parse_policies(["mig", "timeslice,EXCLUSIVE"]) == ("exclusive", "mig", "timeslice")
    config = load(["--prometheus=http://p:9090", f"--simulate={','.join(POLICIES)}"], {})
    assert config.simulate == POLICIES
    assert load(["--prometheus=http://p:9090"], {}).simulate == ()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("current,timeshare", "unknown policy 'timeshare'"),
        (",", "expected policies"),
    ],
)
def test_a_bad_policy_is_a_config_error_naming_it(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as raised:
        load(["--prometheus=http://p:9090", f"--simulate={value}"], {})
    assert str(raised.value).startswith("invalid --simulate: ")


def test_an_unknown_policy_exits_2_with_one_line_before_any_query() -> None:
    queries: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        queries.append(str((await request.post()).get("query")))
        return web.json_response(EMPTY)

    with serving(answer) as url:
        result = rightsize("--prometheus", url, "--simulate=current,binpak", timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        (
            "gpuscope rightsize: error: invalid --simulate: unknown policy 'binpak': one of "
            "current, exclusive, mig, timeslice, binpack"
        )
    ]
    assert queries == []


# -- the placement search -----------------------------------------------------------------------

PERIOD = 48
"""Steps in one period of the known-answer scenarios: eight services, eight slots of 6 steps."""
BASE, PEAK = 0.15, 0.39


def staggered(service: int, periods: int = 2) -> list[float]:
    """Busy BASE, and PEAK in the service's own slot of each period: no two peaks coincide."""
    return [PEAK if (t % PERIOD) // 6 == service else BASE for t in range(periods * PERIOD)]


def together(periods: int = 2) -> list[float]:
    """Busy BASE, and PEAK in the first slot of 8 steps of each period (a sixth of them)."""
    return [PEAK if t % PERIOD < 8 else BASE for t in range(periods * PERIOD)]


GIB = 1024**3


def test_staggered_peaks_fit_three_gpus_step_by_step_where_p95_packing_says_four() -> None:
    items = [Item(staggered(service), 10 * GIB) for service in range(8)]
    groups = pack(items, capacity=0.8, memory=80 * GIB)
    assert len(groups) == 3
    assert sorted(index for group in groups for index in group) == list(range(8))
    for group in groups:
        load = [sum(items[i].demand[t] for i in group) for t in range(2 * PERIOD)]
        assert max(load) <= 0.8 + 1e-9
    p95 = [Item([PEAK] * (2 * PERIOD), 10 * GIB) for _ in range(8)]
    assert len(pack(p95, capacity=0.8, memory=80 * GIB)) == 4


def test_peaks_together_need_four_gpus() -> None:
    items = [Item(together(), 10 * GIB) for _ in range(8)]
    assert [len(group) for group in pack(items, capacity=0.8, memory=80 * GIB)] == [2, 2, 2, 2]


def test_memory_bound_items_never_share_and_one_too_big_is_alone() -> None:
    items = [Item([0.05] * 10, 50 * GIB) for _ in range(3)] + [Item([0.9] * 10, GIB)]
    groups = pack(items, capacity=0.8, memory=80 * GIB)
    assert sorted(map(sorted, groups)) == [[0], [1], [2], [3]]


def test_the_search_is_deterministic_and_improvement_frees_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vectors = [[0.4, 0.3, 0.1], [0.5, 0.2, 0.1], [0.3, 0.3, 0.1], [0.1, 0.1, 0.4], [0.3, 0.1, 0.3]]
    items = [Item(vector, GIB) for vector in vectors]
    found = pack(items, capacity=0.8, memory=80 * GIB)
    assert found == pack(items, capacity=0.8, memory=80 * GIB)
    assert len(found) == 2
    for group in found:
        assert max(sum(items[i].demand[t] for i in group) for t in range(3)) <= 0.8 + 1e-9
    # First fit decreasing alone needs a third GPU.
    monkeypatch.setattr(placement, "IMPROVEMENT_ROUNDS", 0)
    assert len(pack(items, capacity=0.8, memory=80 * GIB)) == 3


def test_mig_instances_are_packed_by_the_catalogs_layouts() -> None:
    a100 = builtin_catalog().find("a100-sxm4-80gb")
    assert a100 is not None
    three = a100.mig_profile("3g.40gb")
    one = a100.mig_profile("1g.10gb")
    seven = a100.mig_profile("7g.80gb")
    assert three
    assert one
    assert seven
    # Two 3g.40gb fill the memory slices: a 1g.10gb needs a GPU of its own beside them.
    assert pack_instances([three, three, one]) == [[0, 1], [2]]
    assert pack_instances([seven, one, one]) == [[0], [1, 2]]
    assert len(pack_instances([one] * 8)) == 2


# -- the policies, on the report's workloads ------------------------------------------------------


def _workloads(busy: list[list[float]], *, memory: float = 10 * GIB, kind: str = "Deployment"):
    a100 = builtin_catalog().find("a100-sxm4-80gb")
    assert a100 is not None
    return [
        Workload("", "serving", kind, f"svc-{number}", Option(a100), tuple(levels), memory)
        for number, levels in enumerate(busy)
    ]


def _replay(workloads: list[Workload], held: float, contended: int = 0, **settings: object):
    steps = len(workloads[0].busy)
    hardware = Hardware.build(builtin_catalog(), Ceilings())
    return {
        result.policy: result
        for result in replay(
            workloads,
            CurrentSteps((held,) * steps, {"a100-sxm4-80gb": held * steps}, contended),
            hardware=hardware,
            settings=StrategySettings(models=("a100-sxm4-80gb",), **settings),  # type: ignore[arg-type]
            policies=POLICIES,
        )
    }


def test_policies_on_staggered_services() -> None:
    results = _replay(_workloads([staggered(service) for service in range(8)]), held=8)
    gpus = {policy: result.gpus.max for policy, result in results.items()}
    assert gpus == {"current": 8, "exclusive": 8, "mig": 4, "timeslice": 3, "binpack": 3}
    busy = PEAK + 7 * BASE
    assert results["current"].utilization_mean == pytest.approx(busy / 8)
    assert results["timeslice"].utilization_mean == pytest.approx(busy / 3)
    assert results["timeslice"].contention_share == 0
    assert {p.mig_profile for p in results["mig"].placements} == {"3g.40gb"}
    assert results["timeslice"].cost_usd_per_month == pytest.approx(3 * 3.43 * 730)
    groups = {p.group for p in results["timeslice"].placements}
    assert len(groups) == 3
    assert None not in groups


def test_policies_on_services_peaking_together() -> None:
    results = _replay(_workloads([together()] * 8), held=3, contended=16)
    assert results["current"].contention_share == pytest.approx(1 / 6)
    assert results["timeslice"].gpus.max == 4
    assert results["binpack"].gpus.max == 4
    assert results["timeslice"].contention_share == 0


def test_memory_bound_workloads_never_share() -> None:
    results = _replay(_workloads([[0.05] * 20] * 4, memory=50 * GIB, kind="StatefulSet"), held=4)
    for policy in ("exclusive", "mig", "timeslice", "binpack"):
        assert results[policy].gpus.max == 4, policy
        assert results[policy].memory_overcommit_steps == 0
    assert all(p.group is None for p in results["timeslice"].placements)
    assert {p.mig_profile for p in results["mig"].placements} == {"7g.80gb"}


def test_binpack_never_needs_more_gpus_than_another_policy() -> None:
    # Tiny batch jobs: timeslice leaves them exclusive, MIG packs seven 1g.10gb per GPU.
    results = _replay(_workloads([[0.05] * 10] * 7, memory=GIB, kind="Job"), held=7)
    assert results["timeslice"].gpus.max == 7
    assert results["mig"].gpus.max == 1
    assert results["binpack"].gpus.max <= min(
        results[policy].gpus.max for policy in ("exclusive", "mig", "timeslice")
    )


def test_a_reported_placement_is_checked_not_trusted() -> None:
    context_workloads = _workloads([together()] * 3)
    hardware = Hardware.build(builtin_catalog(), Ceilings())
    context = engine._Context(hardware, StrategySettings(), len(context_workloads[0].busy))
    a100 = context_workloads[0].current.model
    gpu = engine._Gpu(
        a100, "", [(engine._Shard(w, w.demand, 0.0), None) for w in context_workloads], "g"
    )
    result = evaluate("timeslice", [gpu], context)
    assert result.contention_share == pytest.approx(1 / 6)
    heavy = [replace(w, memory_bytes=30 * GIB) for w in context_workloads]
    gpu = engine._Gpu(a100, "", [(engine._Shard(w, w.demand, 0.0), None) for w in heavy], "g")
    assert evaluate("timeslice", [gpu], context).memory_overcommit_steps == 2 * PERIOD


def test_a_refused_replay_query_costs_the_replay_not_the_report() -> None:
    async def answer(request: web.Request) -> web.Response:
        if request.path.endswith("/query_range"):  # the replay's per-step history alone
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "query too long"},
                status=400,
            )
        return web.json_response(EMPTY)

    with serving(answer) as url:
        result = rightsize("--prometheus", url, "--simulate=current", "--format=json", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "policy replay unavailable" in result.stderr
    document = json.loads(result.stdout)
    assert document["missing_signals"] == ["replay"]
    assert document["simulation"] == []


def test_the_report_server_exports_gpus_and_utilization_per_policy() -> None:
    results = _replay(_workloads([staggered(service) for service in range(8)]), held=8)
    report = replace(sample_report(), simulation=(results["current"], results["timeslice"]))
    text = exposition(recommendation_metrics(report)).decode()
    assert 'gpuscope_simulation_gpus{policy="current"} 8.0' in text
    assert 'gpuscope_simulation_gpus{policy="timeslice"} 3.0' in text
    assert 'gpuscope_simulation_utilization_ratio{policy="timeslice"} 0.48' in text
    plain = exposition(recommendation_metrics(sample_report())).decode()
    assert "gpuscope_simulation" not in plain


def test_the_sentence_bounds_only_the_shared_gpus_when_some_are_a_workloads_own() -> None:
    """A training job busy 95% of every step keeps a GPU of its own under `timeslice`; the
    sentence's saturation promise is about the shared GPUs, not that one."""
    a100 = builtin_catalog().find("a100-sxm4-80gb")
    assert a100 is not None
    serving = [
        Workload("", "serving", "Deployment", f"svc-{n}", Option(a100), (0.2,) * 6, 10 * 2**30)
        for n in range(3)
    ]
    training = Workload("", "ml", "Job", "train", Option(a100), (0.95,) * 6, 10 * 2**30)
    results = replay(
        [*serving, training],
        CurrentSteps((4.0,) * 6, {"a100-sxm4-80gb": 24.0}, 0),
        hardware=hardware(),
        settings=StrategySettings(models=("a100-sxm4-80gb",)),
        policies=("current", "timeslice"),
    )
    assert "no shared GPU over 80% at any step," in summary.sentence(results, saturation=0.8)
    alone = replay(
        serving,
        CurrentSteps((3.0,) * 6, {"a100-sxm4-80gb": 18.0}, 0),
        hardware=hardware(),
        settings=StrategySettings(models=("a100-sxm4-80gb",)),
        policies=("current", "timeslice"),
    )
    assert summary.sentence(alone, saturation=0.8).startswith("time-slicing")
    assert "no step over 80%" in summary.sentence(alone, saturation=0.8)


@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")], ids=["spaced", "compact"])
async def test_the_steps_are_asked_a_slice_per_query_and_each_sample_lands_on_its_step(
    separators: tuple[str, str],
) -> None:
    """288 steps of 10 workload rows: one range query per expression, not one evaluation per
    step; step 0 (at `end`) is the newest, a sample off the grid or past the end is none, and a
    step answered twice counts twice, whether the answer is walked (spaced) or read whole."""
    end, step, steps = 1_700_000_400.0, 600.0, 288
    asked: list[tuple[str, str, str, str]] = []

    def matrix(labels: dict[str, str], values: list[tuple[float, str]]) -> web.Response:
        series = {"metric": labels, "values": [[at, text] for at, text in values]}
        data = {"resultType": "matrix", "result": [series]}
        body = json.dumps({"status": "success", "data": data}, separators=separators)
        return web.Response(text=body, content_type="application/json")

    async def answer(request: web.Request) -> web.Response:
        form = await request.post()
        query = str(form["query"])
        asked.append((request.path, str(form["start"]), str(form["end"]), str(form["step"])))
        if query.startswith("count("):
            return matrix({}, [(end - 5 * step, "1")])
        if query.startswith("count by"):
            return matrix({"model": "a100", "mig_profile": ""}, [(end - step, "2")])
        workload = {"namespace": "ml", "workload_kind": "Deployment", "workload": "w"}
        newest, oldest, off_grid, later = end, end - (steps - 1) * step, end - 300, end + step
        return matrix(
            {**workload, "model": "a100", "mig_profile": ""},
            [(oldest, "0.25"), (oldest, "0.25"), (off_grid, "9"), (newest, "1"), (later, "9")],
        )

    with serving(answer) as url:
        async with PrometheusClient(Connection(url=url)) as client:
            history = await fetch_steps(
                client,
                selection=Selection(),
                end=end,
                window=steps * step,
                step=step,
                cluster_label=None,
                configurations=10,
            )
    assert history is not None
    whole = ("/api/v1/query_range", f"{end - (steps - 1) * step:.3f}", f"{end:.3f}", "600")
    assert asked == [whole] * 3
    (busy,) = history.busy.values()
    assert (busy[0], busy[steps - 1], sum(busy)) == (0.5, 1.0, 1.5)
    assert history.held[steps - 2] == {("a100", ""): 2.0}
    assert [index for index, yes in enumerate(history.contended) if yes] == [steps - 6]


@pytest.mark.parametrize(
    ("limit", "demand_queries"),
    [
        # 400,000 samples an answer: 40 steps of 10,000 rows (100,000 samples asked 202).
        (None, 51),
        # An 8 MiB answer limit holds 104,857 samples of at most 40 bytes in half of it: 10 steps.
        (8 * 2**20, 202),
    ],
)
async def test_the_slices_are_as_long_as_the_answer_limit_allows(
    limit: int | None, demand_queries: int
) -> None:
    """10,000 workload rows over 14 days at 10-minute steps: each query costs the server its
    series' lookup and their blocks around the slice whatever the slice's length, so the slices
    are as long as an answer may be (half the answer limit), and cover every step once."""
    end, step, steps = 1_700_000_400.0, 600.0, 2016
    asked: dict[str, list[tuple[float, float]]] = {}

    async def answer(request: web.Request) -> web.Response:
        form = await request.post()
        query = str(form["query"])
        name = (
            "contended"
            if query.startswith("count(")
            else "held"
            if "count by" in query
            else "demand"
        )
        asked.setdefault(name, []).append((float(str(form["start"])), float(str(form["end"]))))
        data = {"resultType": "matrix", "result": []}
        return web.json_response({"status": "success", "data": data})

    with serving(answer) as url:
        connection = (
            Connection(url=url) if limit is None else Connection(url=url, max_response_bytes=limit)
        )
        async with PrometheusClient(connection) as client:
            history = await fetch_steps(
                client,
                selection=Selection(),
                end=end,
                window=steps * step,
                step=step,
                cluster_label=None,
                configurations=10_000,
            )
    assert history is not None
    assert (len(asked["held"]), len(asked["contended"])) == (1, 1)
    assert len(asked["demand"]) == demand_queries
    covered = sorted(
        round((end - at) / step)
        for start, stop in asked["demand"]
        for at in _grid(start, stop, step)
    )
    assert covered == list(range(steps))


def _grid(start: float, stop: float, step: float) -> list[float]:
    return [start + n * step for n in range(round((stop - start) / step) + 1)]
