"""Hostile answer shapes within `--prometheus.max-response-size`: none of them is built whole,
so none costs more than a few times its size (the job's CronJob has 512 MiB)."""

from __future__ import annotations

import tracemalloc

import pytest
from aiohttp import web

from exporter.rightsize.answer import Bounds, Vector, answer_labels, read_answer
from exporter.rightsize.prometheus import (
    Connection,
    PrometheusClient,
    PrometheusQueryError,
    Sample,
)
from tests.hostile_answers import (
    HEAD,
    MATRIX_HEAD,
    MATRIX_SHAPES,
    SIZE,
    answering,
    matrix_samples,
)
from tests.rightsize_run import serving

pytestmark = pytest.mark.timeout(120)

EMPTY_VECTOR = '"data":{"resultType":"vector","result":[]}'
SHAPES = {
    "an error of many empty arrays": (
        '{"status":"error","error":[' + ",".join(["[]"] * (SIZE // 3)) + "]}"
    ),
    "many warnings that are objects": (
        '{"status":"success","warnings":['
        + ",".join(["{}"] * (SIZE // 3))
        + "],"
        + EMPTY_VECTOR
        + "}"
    ),
    "an element carrying a long array": (
        HEAD
        + '{"metric":{"pod":"a"},"value":[1,"1"],"pad":['
        + ",".join(["{}"] * (SIZE // 3))
        + "]}]}}"
    ),
    "an error type of many empty objects": (
        '{"status":"error","errorType":[' + ",".join(["{}"] * (SIZE // 3)) + '],"error":"x"}'
    ),
}


async def query(url: str, promql: str = "max by (pod) (up)") -> list[Sample]:
    async with PrometheusClient(Connection(url=url), backoff=(0.01,)) as client:
        return await client.query(promql, at=1700000000, name="busy_mean")


async def peak_bytes(url: str) -> tuple[int, list[Sample] | str]:
    """The most memory Python allocated while the query ran, and its samples (or error)."""
    tracemalloc.start()
    try:
        try:
            found: list[Sample] | str = await query(url)
        except PrometheusQueryError as error:
            found = str(error)
        return tracemalloc.get_traced_memory()[1], found
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_hostile_shape_costs_a_few_times_its_size(shape: str) -> None:
    body = SHAPES[shape]
    with serving(answering(body)) as url:
        peak, found = await peak_bytes(url)
    # The body, its growth while read, and its text: about 4 times; built whole, 20 times.
    assert peak < 8 * len(body), f"{peak / 2**20:.0f} MiB for {len(body) / 2**20:.0f} MiB"
    if isinstance(found, str):
        assert "\n" not in found
        assert len(found) < 600


async def test_an_errors_text_is_read_only_as_far_as_shown() -> None:
    body = '{"status":"error","errorType":"bad_data","error":"' + "é" * SIZE + '"}'
    with serving(answering(body)) as url, pytest.raises(PrometheusQueryError) as caught:
        await query(url)
    assert str(caught.value).endswith("(HTTP 200): bad_data: " + "é" * 199 + "…")


async def test_only_the_labels_a_query_groups_by_are_kept() -> None:
    """A forged series' other labels (300 of them, say) are dropped as read; a label named in
    a string literal of the query (a pod name, say) is not one it groups by."""
    other = ",".join(f'"l{n}":"{n}"' for n in range(300))
    body = HEAD + f'{{"metric":{{"pod":"a",{other}}},"value":[1,"0.5"]}}' + "]}}"
    with serving(answering(body)) as url:
        grouped = await query(url, 'max by (pod) (up{pod=~"by (l7)"})')
        trivial = await query(url, "vector(1)")
    assert grouped == [Sample({"pod": "a"}, 0.5)]
    assert trivial == [Sample({}, 0.5)]


@pytest.mark.parametrize(
    ("promql", "labels"),
    [
        (
            (
                'label_replace(sum by (pod) (x{a="1,2", b="("}), "replay_step", "3", "", "")'
                ' or label_replace(sum by (namespace) (y), "replay_step", "4", "", "")'
            ),
            {"pod", "namespace", "replay_step"},
        ),
        ('label_join(max by (a, b) (up), "both", ",", "a", "b")', {"a", "b", "both"}),
        ('max by (pod) (up{pod="label_replace(up, \\"evil\\""})', {"pod"}),
    ],
)
def test_the_labels_label_replace_and_label_join_write_are_kept(
    promql: str, labels: set[str]
) -> None:
    """The replay tags each step's term with `label_replace` (its answers lost the step's number
    when only grouping labels were kept); a call spelled inside a matcher's value writes none."""
    assert answer_labels(promql) == labels


async def test_a_label_value_longer_than_any_name_drops_its_series() -> None:
    body = HEAD + '{"metric":{"pod":"' + "p" * SIZE + '"},"value":[1,"1"]},'
    body += '{"metric":{"pod":"b"},"value":[1,"2"]}]}}'
    with serving(answering(body)) as url:
        assert await query(url) == [Sample({"pod": "b"}, 2.0)]


async def query_range(url: str, promql: str = "max by (pod) (up)") -> list[Sample]:
    async with PrometheusClient(Connection(url=url), backoff=(0.01,)) as client:
        answer = await client.query_matrix(
            promql, start=1700000000, end=1700000600, step=300, name="replay demand"
        )
    return matrix_samples(answer)


async def test_a_matrix_is_read_a_sample_at_a_time_with_its_time() -> None:
    body = MATRIX_HEAD + '{"metric":{"pod":"a","other":"x"},"values":[[1700000000,"0.5"],'
    body += '[1700000300.5,"1"]]},{"metric":{"pod":"b"},"values":[[1700000600,"2"]]}]}}'
    asked: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        form = await request.post()
        asked.append(f"{request.path} {form['start']} {form['end']} {form['step']}")
        return web.Response(body=body.encode(), content_type="application/json")

    with serving(handle) as url:
        found = await query_range(url)
    assert asked == ["/api/v1/query_range 1700000000.000 1700000600.000 300"]
    assert found == [
        Sample({"pod": "a"}, 0.5, 1700000000),
        Sample({"pod": "a"}, 1.0, 1700000300.5),
        Sample({"pod": "b"}, 2.0, 1700000600),
    ]


async def test_a_vector_answering_a_range_query_is_refused() -> None:
    with serving(answering(HEAD + "]}}")) as url, pytest.raises(PrometheusQueryError) as caught:
        await query_range(url)
    assert "returned vector, expected a range matrix" in str(caught.value)


@pytest.mark.parametrize("shape", list(MATRIX_SHAPES))
async def test_a_hostile_matrix_shape_costs_a_few_times_its_size(shape: str) -> None:
    body = MATRIX_SHAPES[shape]
    with serving(answering(body)) as url:
        tracemalloc.start()
        try:
            found = await query_range(url)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 8 * len(body), f"{peak / 2**20:.0f} MiB for {len(body) / 2**20:.0f} MiB"
    assert len(found) <= 1


def test_a_flat_series_keeps_and_drops_each_sample_as_one_walked_would() -> None:
    """A series whose samples are all in the flat shape is matched at once; each is still judged
    alone: kept, or dropped and counted with the reason a walked sample gets."""
    flat = '[[1,"0.5"],[2,"NaN"],[3,"abc"],[4,"7"],[1e999,"1"],[6,"0.25"]]'
    walked = '[[1,"0.5"],[2,"NaN"],[3,"abc"],[4,"7"],[1e999,"1"],[6,"0.25"],[7,"1",8]]'
    found = {}
    for name, values in (("flat", flat), ("walked", walked)):
        vector = Vector(None, Bounds(0, 5, "a ratio"), frozenset({"pod"}), kind="matrix")
        body = MATRIX_HEAD + '{"metric":{"pod":"a","job":"x"},"values":' + values + "}]}}"
        assert read_answer(bytearray(body.encode()), vector) is not None
        found[name] = (vector.samples, vector.bad, vector.why_bad)
    kept = [Sample({"pod": "a"}, 0.5, 1), Sample({"pod": "a"}, 0.25, 6)]
    assert found["flat"] == (kept, 4, "value nan is not a finite number")
    assert found["walked"] == (kept, 5, "value nan is not a finite number")
