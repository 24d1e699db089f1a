"""The streaming JSON reader the cluster's answers go through: whatever the document and however
its bytes are cut into chunks, it keeps exactly what a whole parse pruned to the shape keeps; it
refuses what is not JSON in one line, and a value past its limit before reading it whole."""

from __future__ import annotations

import json
import re
import tracemalloc
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.attribution.jsonstream import (
    MAX_KEY,
    MAX_TEXT,
    TEXT,
    WHOLE_LINE_BYTES,
    Entries,
    Fields,
    Incomplete,
    Items,
    JsonError,
    JsonStream,
    Scalar,
    Shape,
    TooLarge,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

pytestmark = pytest.mark.timeout(120)

BOUNDED = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def first_or_flagged(item: object, kept: Sequence[object]) -> object | None:
    return item if not kept or (isinstance(item, dict) and item.get("flag") is True) else None


SHAPES: dict[str, Shape] = {
    "text": TEXT,
    "short": Scalar(max_length=3),
    "fields": Fields(
        {
            "a": TEXT,
            "b": Fields({"c": Scalar(max_length=5), "d": Items(TEXT, max_items=2)}),
            'q"\\': TEXT,
        }
    ),
    "entries": Entries(Scalar(max_length=4), keep=lambda key: key.startswith("k"), max_entries=3),
    "items": Items(Fields({"name": TEXT, "flag": TEXT}), select=first_or_flagged),
    "nested": Items(Items(Entries(TEXT, keep=lambda key: True, max_entries=2), max_items=3)),
}
KEYS = st.sampled_from(["a", "b", "c", "d", "k1", "k2", "k3", "k4", "name", "flag", 'q"\\', "x"])
TEXTS = st.text(
    alphabet=st.sampled_from(list('ab"\\{}[],: \n\té€😀\x00\u2028')), max_size=12
) | st.sampled_from(["", "a" * (MAX_TEXT + 5), "😀" * (MAX_TEXT + 1)])
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
VALUES = st.recursive(
    SCALARS | TEXTS,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(KEYS | TEXTS, children, max_size=5)
    ),
    max_leaves=30,
)


def pruned(value: Any, shape: Shape) -> Any:
    """What a whole parse keeps of `value` (from `json.loads` with `object_pairs_hook=list`)."""
    if isinstance(value, str):
        return value[: shape.max_length if isinstance(shape, Scalar) else MAX_TEXT]
    if isinstance(value, Pairs):
        if isinstance(shape, Fields):
            return {
                key: pruned(item, shape.fields[key])
                for key, item in value
                if len(key) <= MAX_KEY and key in shape.fields
            }
        if isinstance(shape, Entries):
            found: dict[str, Any] = {}
            for key, item in value:
                if len(key) > MAX_KEY or not shape.keep(key):
                    continue
                if key in found or len(found) < shape.max_entries:
                    found[key] = pruned(item, shape.value)
            return found
        return None
    if isinstance(value, list):
        if not isinstance(shape, Items):
            return None
        kept: list[Any] = []
        for item in value:
            if len(kept) >= shape.max_items:
                break
            one = pruned(item, shape.item)
            one = one if shape.select is None else shape.select(one, kept)
            if one is not None:
                kept.append(one)
        return kept
    return value


class Pairs(list):  # type: ignore[type-arg]
    """An object as `json.loads` reads it with `object_pairs_hook`: its (key, value) pairs."""


def reference(document: bytes, shape: Shape) -> Any:
    return pruned(json.loads(document, object_pairs_hook=Pairs), shape)


def chunked(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    start = 0
    for cut in sorted(cuts):
        yield data[start:cut]
        start = cut
    yield data[start:]


def read(data: bytes, shape: Shape, cuts: list[int] | None = None, limit: int = 2**30) -> object:
    return JsonStream(chunked(data, cuts or []), max_value_bytes=limit, what="the answer").value(
        shape
    )


@BOUNDED
@given(
    value=VALUES,
    shape=st.sampled_from(sorted(SHAPES)),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
    data=st.data(),
)
def test_keeps_what_a_whole_parse_pruned_to_the_shape_keeps(
    value: Any, shape: str, ascii_only: bool, indent: int | None, data: st.DataObject
) -> None:
    document = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    cuts = data.draw(st.lists(st.integers(0, len(document)), max_size=8))
    assert read(document, SHAPES[shape], cuts) == reference(document, SHAPES[shape])


@BOUNDED
@given(values=st.lists(VALUES, max_size=4), data=st.data())
def test_a_stream_of_documents_is_read_one_by_one(values: list[Any], data: st.DataObject) -> None:
    stream = b"".join(json.dumps(value).encode() + b"\n" for value in values)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    shape = SHAPES["nested"]
    found = list(JsonStream(chunked(stream, cuts), max_value_bytes=2**30, what="x").values(shape))
    assert found == [reference(json.dumps(value).encode(), shape) for value in values]


@BOUNDED
@given(data=st.binary(max_size=40) | st.text(alphabet='{}[]",: a1.e-tnul\\', max_size=40))
def test_anything_else_is_a_value_or_one_error(data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    problem = ""
    try:
        read(raw, SHAPES["fields"])
    except JsonError as error:
        problem = str(error)
    assert "\n" not in problem


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (b"", "is empty"),
        (b'{"a": "b"', "ends in the middle"),
        (b'{"a": "b', "ends in the middle of a string"),
        (b'{"a": [1, 2', "ends in the middle"),
        (b'{"x": [1, {"y": "]"}', "ends in the middle"),
        (b'{"a" "b"}', "expected ':'"),
        (b'{"a": "b" "c"}', "expected ',' or '}'"),
        (b"{a: 1}", "expected a key"),
        (b'{"a": nope}', "a value that is not one"),
        (b'{"a": ' + b"1" * 100 + b"}", "a value that is not one"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"{} {}", "more than one document"),
    ],
)
def test_not_json_is_one_line(document: bytes, problem: str) -> None:
    with pytest.raises(JsonError) as caught:
        read(document, SHAPES["fields"], cuts=[3, 7])
    assert problem in str(caught.value)
    assert str(caught.value).startswith("the answer ")


def test_a_value_past_its_limit_is_refused_before_it_is_read_whole() -> None:
    huge = b'{"a": "' + b"x" * (4 << 20) + b'"}'
    with pytest.raises(TooLarge, match=re.escape("the answer is larger than 1 MiB")):
        read(huge, TEXT, cuts=list(range(0, len(huge), 65536)), limit=1 << 20)
    events = b'{"a": 1}\n' * 200_000  # 1.8 MB of small documents: each is in its limit
    cuts = list(range(0, len(events), 65536))
    stream = JsonStream(chunked(events, cuts), max_value_bytes=64, what="x")
    assert sum(1 for _ in stream.values(SHAPES["fields"])) == 200_000


def test_an_unfinished_stream_says_so() -> None:
    stream = JsonStream([b'{"a": 1}\n{"a": '], max_value_bytes=1024, what="a watch event")
    found = stream.values(SHAPES["fields"])
    assert next(found) == {"a": 1}
    with pytest.raises(Incomplete):
        next(found)


def test_what_is_skipped_is_never_held() -> None:
    """A pod of 1.4 MB of small env entries, in 64 KiB chunks: what is read stays near a chunk
    (a whole parse holds tens of MB)."""
    env = [{"name": f"E{i:06d}", "value": "xxxx"} for i in range(40_000)]
    document = json.dumps(
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "env": env}]}}
    ).encode()
    shape = Fields(
        {
            "metadata": Fields({"name": TEXT}),
            "spec": Fields({"containers": Items(Fields({"name": TEXT}))}),
        }
    )
    chunks = [document[i : i + 65536] for i in range(0, len(document), 65536)]
    tracemalloc.start()
    try:
        found = JsonStream(iter(chunks), max_value_bytes=8 << 20, what="x").value(shape)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert len(document) > 1_400_000
    assert peak < 512 * 1024, f"{peak:,} bytes held while reading"


def test_a_large_watch_event_is_read_as_it_arrives_a_small_one_whole() -> None:
    """Events on lines of their own: one of 1.4 MB, between two small ones parsed whole."""
    env = [{"name": f"E{i:06d}", "value": "xxxx"} for i in range(40_000)]
    large = {"object": {"metadata": {"name": "large"}, "spec": {"env": env}}}
    events = [{"object": {"metadata": {"name": "before"}}}, large, {"object": {"x": 1}}]
    stream = b"".join(json.dumps(event).encode() + b"\n" for event in events)
    assert len(stream) > 20 * WHOLE_LINE_BYTES
    shape = Fields({"object": Fields({"metadata": Fields({"name": TEXT})})})
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    tracemalloc.start()
    try:
        found = list(JsonStream(iter(chunks), max_value_bytes=8 << 20, what="x").values(shape))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == [
        {"object": {"metadata": {"name": "before"}}},
        {"object": {"metadata": {"name": "large"}}},
        {"object": {}},
    ]
    assert peak < 1024 * 1024, f"{peak:,} bytes held while reading"


def test_fields_merge() -> None:
    one = Fields({"metadata": Fields({"name": TEXT}), "spec": TEXT})
    other = Fields({"metadata": Fields({"resourceVersion": TEXT}), "code": TEXT})
    merged = one.merged(other)
    assert set(merged.fields) == {"metadata", "spec", "code"}
    metadata = merged.fields["metadata"]
    assert isinstance(metadata, Fields)
    assert set(metadata.fields) == {"name", "resourceVersion"}
