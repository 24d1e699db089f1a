"""A range answer read as columns (`exporter/rightsize/matrix.py`, the policy replay's reader)
keeps, drops, counts and names exactly what the sample-at-a-time reader does, whatever the
answer's shape, and costs no more memory on a hostile one."""

from __future__ import annotations

import tracemalloc
from typing import TYPE_CHECKING, Final

import numpy as np
import pytest

from exporter.rightsize.answer import Bounds, Vector, read_answer
from exporter.rightsize.matrix import Columns
from exporter.rightsize.prometheus import Connection, PrometheusClient
from tests.hostile_answers import MATRIX_SHAPES, answering
from tests.rightsize_run import serving

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.rightsize.matrix import Matrix

pytestmark = pytest.mark.timeout(60)

HEAD: Final = '{"status":"success","data":{"resultType":"matrix","result":['
BOUNDS: Final = Bounds(0.0, 5.0, "busy GPUs")


def series(pod: str, values: str, *, extra: str = "") -> str:
    return f'{{"metric":{{"pod":"{pod}","job":"x"{extra}}},"values":{values}}}'


ANSWERS: Final = {
    "flat": [series("a", '[[1,"0.5"],[2,"1.25"]]'), series("b", '[[1,"2"],[3,"0.08123456789"]]')],
    "decimal times and exponents": [series("a", '[[1.5,"1e-3"],[2.25,"+2.5E0"],[3,".5"]]')],
    "empty values": [series("a", "[]"), series("b", '[[1,"1"]]')],
    "a NaN among numbers": [series("a", '[[1,"0.5"],[2,"NaN"],[3,"1"]]')],
    "out of bounds parsed whole": [series("a", '[[1,"0.5"],[2,"7"],[3,"-1"]]')],
    "an overflow to infinity": [series("a", '[[1,"0.5"],[2,"1e999"]]')],
    "a time overflowing": [series("a", '[[1e999,"0.5"],[2,"1"]]')],
    "no number of a number's characters": [series("a", '[[1,"1e"],[2,"1-2"],[3,"."]]')],
    "a value too long to be read": [series("a", f'[[1,"{"1" * 65}"],[2,"1"]]')],
    "a value of 41 characters": [series("a", f'[[1,"0.{"1" * 39}"]]')],
    "a time longer than a time": [series("a", f'[[{"1" * 45},"1"],[2,"1"]]')],
    "a time a server never writes": [series("a", '[[-.5,"1"],[+2,"1"]]')],
    "a walked bad one, then a whole bad one": [
        series("a", '[[1,"1"],[2,"1",3]]'),
        series("b", '[[1,"9"]]'),
    ],
    "a whole bad one, then a walked bad one": [
        series("b", '[[1,"9"],[2,"1"]]'),
        series("a", '[[1,"NaN"]]'),
    ],
    "a malformed series between whole bad ones": [
        series("a", '[[1,"1"]]'),
        '{"values":[[1,"1"]],"metric":{"pod":"c"}}',
        series("b", '[[1,"-3"]]'),
    ],
    "two series of the same labels": [series("a", '[[1,"1"]]'), series("a", '[[1,"2"]]')],
    "a step twice": [series("a", '[[1,"1"],[1,"2"]]')],
    "a value holding brackets": [series("a", '[[1,"1],[2,3"]]')],
    "spaces": ['{"metric":{"pod":"a"},"values":[ [1, "1"] , [2,"2"]]}'],
    "a label too long": [series("a", '[[1,"1"]]', extra=f',"model":"{"m" * 1025}"')],
    "a series with another member": [series("a", '[[1,"1"]]')[:-1] + ',"pad":[1]}'],
    "a label that is no string": ['{"metric":{"pod":1},"values":[[1,"1"]]}'],
    "a foreign series": [series("z", '[[1,"1"],[2,"NaN"]]'), series("a", '[[1,"1"]]')],
}


def keep(labels: Mapping[str, str]) -> bool:
    return labels.get("pod") != "z"


def read(vector: Vector, elements: list[str]) -> bool:
    """Whether the body is an answer (one that is not is refused whole, whoever reads it)."""
    body = HEAD + ",".join(elements) + "]}}"
    answer = read_answer(bytearray(body.encode()), vector)
    vector.finish()
    return answer is not None


def rows(matrix: Matrix) -> list[tuple[dict[str, str], float, float]]:
    return [
        (dict(labels), float(matrix.times[i]), float(matrix.values[i]))
        for labels, part in matrix.series()
        for i in range(part.start, part.stop)
    ]


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_columns_keep_drop_and_count_as_samples_do(answer: str) -> None:
    labels = frozenset({"pod", "model"})
    one_by_one = Vector(keep, BOUNDS, labels, kind="matrix")
    columns = Columns(keep, BOUNDS, labels)
    assert read(one_by_one, ANSWERS[answer]) == read(columns, ANSWERS[answer])
    expected = [(dict(s.labels), s.at, s.value) for s in one_by_one.samples]
    assert rows(columns.matrix()) == expected
    assert (columns.bad, columns.first_bad, columns.why_bad, columns.foreign) == (
        one_by_one.bad,
        one_by_one.first_bad,
        one_by_one.why_bad,
        one_by_one.foreign,
    )


def test_a_whole_series_is_parsed_to_the_same_numbers_as_float_does() -> None:
    generator = np.random.default_rng(30)
    values = [repr(float(v)) for v in generator.random(500) * 3] + ["1e-300", "5", "0"]
    points = ",".join(f'[{1795818600 + 600 * n},"{value}"]' for n, value in enumerate(values))
    columns = Columns(None, BOUNDS, None)
    assert read(columns, [series("a", f"[{points}]")])
    matrix = columns.matrix()
    assert matrix.values.tolist() == [float(value) for value in values]
    assert matrix.times.tolist() == [1795818600.0 + 600 * n for n in range(len(values))]


@pytest.mark.parametrize("shape", list(MATRIX_SHAPES))
async def test_a_hostile_matrix_shape_read_as_columns_costs_a_few_times_its_size(
    shape: str,
) -> None:
    body = MATRIX_SHAPES[shape]
    with serving(answering(body)) as url:
        async with PrometheusClient(Connection(url=url), backoff=(0.01,)) as client:
            tracemalloc.start()
            try:
                found = await client.query_matrix(
                    "max by (pod) (up)", start=1700000000, end=1700000600, step=300
                )
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    assert peak < 8 * len(body), f"{peak / 2**20:.0f} MiB for {len(body) / 2**20:.0f} MiB"
    assert found.values.size <= 1
