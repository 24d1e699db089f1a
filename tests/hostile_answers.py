"""Answers a hostile or odd PromQL API may give, and a stand-in server's handler answering one:
shared by the answer reader's tests (tests/test_rightsize_answers.py) and the column reader's
(tests/test_rightsize_matrix.py), which must read each alike; and a column answer's samples as
`Sample`s, to compare with what a test expects."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from exporter.rightsize.prometheus import Sample

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from exporter.rightsize.matrix import Matrix

SIZE = 3 * 2**20
"""A tenth of the default limit: enough for a blow-up to show, small enough for a test."""
HEAD = '{"status":"success","data":{"resultType":"vector","result":['
MATRIX_HEAD = '{"status":"success","data":{"resultType":"matrix","result":['
MATRIX_SHAPES = {
    "a series carrying a long array": (
        MATRIX_HEAD
        + '{"metric":{"pod":"a"},"values":[[1,"1"]],"pad":['
        + ",".join(["{}"] * (SIZE // 3))
        + "]}]}}"
    ),
    "a sample of many empty arrays": (
        MATRIX_HEAD
        + '{"metric":{"pod":"a"},"values":[[1,"1",'
        + ",".join(["[]"] * (SIZE // 3))
        + "]]}]}}"
    ),
    "many samples": (
        MATRIX_HEAD
        + '{"metric":{"pod":"a"},"values":['
        + ",".join(['[1,"NaN"]'] * (SIZE // 100))
        + "]}]}}"
    ),
}


def answering(body: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    data = body.encode()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=data, content_type="application/json")

    return handle


def matrix_samples(matrix: Matrix) -> list[Sample]:
    """The samples of a column answer, series after series, each with its time."""
    return [
        Sample(labels, float(matrix.values[i]), float(matrix.times[i]))
        for labels, part in matrix.series()
        for i in range(part.start, part.stop)
    ]
