"""The calibration profile schema: round trips, and one error type, one line, for any malformed
input — an alias bomb, binary bytes, a key given twice and an oversized file included."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.calibration.parse import (
    MAX_PROFILE_BYTES,
    load_profile,
    parse_profile,
    parse_profile_text,
)
from exporter.calibration.profile import (
    PROFILE_KIND,
    Figure,
    ProfileError,
    Skipped,
    configmap_key,
    dump_profile,
    profile_document,
)
from tests.profiles import gpu_profile
from tests.yaml_bombs import alias_bomb

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_round_trip(fmt: str) -> None:
    profile = gpu_profile()
    text = dump_profile(profile, fmt)  # type: ignore[arg-type]
    assert parse_profile_text(text, source="p", fmt=fmt) == profile  # type: ignore[arg-type]
    assert parse_profile_text(text.encode(), source="p") == profile  # format sniffed


def test_document_carries_units_spread_datasheet_and_achieved_fraction() -> None:
    document = profile_document(gpu_profile())
    assert document["kind"] == PROFILE_KIND
    assert document["version"] == 1
    copy_ = document["memory_bandwidth"]["copy"]
    assert copy_["unit"] == "B/s"
    assert copy_["datasheet"] == 3.35e12
    assert copy_["achieved_ratio"] == pytest.approx(3.0e12 / 3.35e12)
    assert copy_["spread"] == pytest.approx(0.03)
    assert document["matmul"]["int8"] == {"skipped": "int8 matmul is not supported here"}
    assert document["matmul"]["bf16"]["unit"] == "FLOP/s"
    assert document["launch_latency"]["eager"]["unit"] == "s"
    assert set(document["matmul"]) == {"fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"}


def test_derived_figures() -> None:
    profile = gpu_profile()
    assert profile.memory_bandwidth == 3.1e12  # the better of copy and read
    assert profile.calibrated_flops["bf16"] == 7.92e14
    assert "int8" not in profile.calibrated_flops
    bf16 = profile.matmul["bf16"]
    assert isinstance(bf16, Figure)
    assert bf16.achieved_ratio is None  # no datasheet given in this profile


def test_yaml_written_by_hand_with_an_unquoted_timestamp_is_accepted() -> None:
    text = dump_profile(gpu_profile(), "yaml").replace(
        "measured_at: '2026-11-20T10:00:00Z'", "measured_at: 2026-11-20T10:00:00Z"
    )
    assert "measured_at: 2026-11-20T10:00:00Z" in text
    assert parse_profile_text(text, source="p").measured_at.startswith("2026-11-20T10:00:00")


def test_configmap_keys_are_valid_kubernetes_keys() -> None:
    assert configmap_key("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3.json"
    assert configmap_key("Tesla V100-SXM2-32GB") == "tesla-v100-sxm2-32gb.json"
    assert (
        configmap_key("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13-64-core-processor.json"
    )
    assert configmap_key("???") == "unknown.json"


def _document() -> dict[str, Any]:
    return copy.deepcopy(profile_document(gpu_profile()))


def _set(path: str, value: Any) -> dict[str, Any]:
    document = _document()
    *parents, last = path.split(".")
    node = document
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return document


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "kind",
            "something-else",
            "kind: expected 'gpuscope/calibration-profile': this is not a calibration profile",
        ),
        ("version", 2, "version: 2 is not 1, the version this gpuscope reads"),
        ("version", True, "version: True is not 1, the version this gpuscope reads"),
        ("model", "", "model: must not be empty"),
        ("model", " ", "model: ' ' is not non-blank text"),
        ("model", 7, "model: expected a string, got a number"),
        ("model", "x\ny", "model: 'x\\ny' has control characters"),
        ("model", "x" * 300, "model: longer than 256 characters"),
        ("device", "tpu", "device: 'tpu' is not one of cuda, cpu"),
        ("measured_at", "yesterday", "measured_at: 'yesterday' is not an ISO 8601 time"),
        (
            "measured_at",
            "2026-11-20T10:00:00",
            "measured_at: the time needs a UTC offset (e.g. 2026-11-22T02:30:00Z)",
        ),
        ("quick", "no", "quick: expected true or false, got 'no'"),
        ("duration_seconds", -1, "duration_seconds: -1 is below 0"),
        ("software", None, "software: expected a mapping, got null"),
        ("software.torch", _DELETE, "software: missing field torch"),
        ("method.trials", 0, "method.trials: 0 is outside 1..1000000"),
        (
            "method.timer",
            "sundial",
            "method.timer: 'sundial' is not one of cuda_events, monotonic_clock",
        ),
        (
            "conditions.before.power_watts",
            "hot",
            "conditions.before.power_watts: expected a number, got a string",
        ),
        (
            "conditions.after.clock_event_reasons",
            "idle",
            "conditions.after.clock_event_reasons: expected a list, got a string",
        ),
        (
            "conditions.after.clock_event_reasons",
            ["gpu_idle", 3],
            "conditions.after.clock_event_reasons[1]: expected a string, got a number",
        ),
        ("matmul.fp8", _DELETE, "matmul: missing field fp8"),
        ("matmul.fp4", {"skipped": "x"}, "matmul: unknown field 'fp4'"),
        ("matmul.bf16.value", float("nan"), "matmul.bf16.value: must be a finite number"),
        ("matmul.bf16.value", 10**400, "matmul.bf16.value: must be a finite number"),
        ("matmul.bf16.value", 0, "matmul.bf16.value: must be greater than 0"),
        ("matmul.bf16.value", 1e20, "matmul.bf16: expected min <= value <= max"),
        ("matmul.bf16.unit", "B/s", "matmul.bf16.unit: expected 'FLOP/s', got 'B/s'"),
        (
            "matmul.int8",
            {
                "value": 1.0,
                "unit": "FLOP/s",
                "min": 1.0,
                "max": 1.0,
                "trials": 1,
                "unstable": False,
            },
            "matmul.int8.unit: expected 'OP/s', got 'FLOP/s'",
        ),
        ("matmul.bf16.trials", 2.5, "matmul.bf16.trials: expected a whole number, got 2.5"),
        ("matmul.bf16.unstable", 0, "matmul.bf16.unstable: expected true or false, got 0"),
        ("matmul.bf16.spread", "wide", "matmul.bf16.spread: expected a number, got a string"),
        ("matmul.bf16.colour", "blue", "matmul.bf16: unknown field 'colour'"),
        ("matmul.tf32", {"skipped": ""}, "matmul.tf32.skipped: must not be empty"),
        ("matmul.tf32", {"skipped": "x", "value": 1}, "matmul.tf32: unknown field 'value'"),
        ("memory_bandwidth", [], "memory_bandwidth: expected a mapping, got a list"),
        ("host_to_device.unit", "GB/s", "host_to_device.unit: expected 'B/s', got 'GB/s'"),
        ("launch_latency.cuda_graph", _DELETE, "launch_latency: missing field cuda_graph"),
        ("extra", 1, "unknown field 'extra'"),
    ],
)
def test_every_malformed_field_is_named(path: str, value: Any, message: str) -> None:
    with pytest.raises(ProfileError) as raised:
        parse_profile(_set(path, value), source="h100.json")
    assert str(raised.value) == f"h100.json: {message}"


@pytest.mark.parametrize(
    "document",
    [None, [], "profile", 3, 2.5, True, {}, {"kind": PROFILE_KIND}, {1: 2}, {"kind": [1]}],
)
def test_junk_documents_raise_profile_error(document: object) -> None:
    with pytest.raises(ProfileError):
        parse_profile(document)


def test_non_string_field_names_are_refused() -> None:
    document = _document()
    document["matmul"][3] = {"skipped": "x"}
    with pytest.raises(ProfileError, match=r"^profile: matmul: keys must be strings, got 3$"):
        parse_profile(document)


def _duplicated(fmt: str) -> str:
    """A valid profile with `quick` given twice."""
    text = dump_profile(gpu_profile(), fmt)  # type: ignore[arg-type]
    if fmt == "json":
        return text.replace('"quick": false,', '"quick": false,\n  "quick": true,')
    return text.replace("quick: false\n", "quick: false\nquick: true\n")


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        (b"\xff\xfe{", None, r"^f: not UTF-8 text \(byte 0 is 0xff\)$"),
        (b"kind: \x00\x9f\x92\x96", "yaml", r"^f: not UTF-8 text \(byte 7 is 0x9f\)$"),
        ("{not json", "json", r"^f: not valid JSON at line 1: "),
        ("a: [unclosed", "yaml", r"^f: not valid YAML at line 2: did not find expected"),
        ("[" * 100_000 + "]" * 100_000, "json", r"^f: nested too deeply$"),
        ("x" * (MAX_PROFILE_BYTES + 1), "yaml", r"^f: larger than 1 MiB \(the limit\)$"),
        ("", "yaml", r"^f: expected a mapping at the top level, got null$"),
        ('{"kind": NaN}', "json", r"^f: kind: expected"),
        ("!!python/object:os.system {}", "yaml", r"^f: not valid YAML"),
        (alias_bomb(), "yaml", r"^f: expands to more than 100,000 values \(aliases repeated\?\)$"),
        ("a: &a [1, *a]\n", "yaml", r"^f: an alias contains itself \(line 1\)$"),
        (_duplicated("yaml"), "yaml", r"^f: key 'quick' appears twice in one mapping \(line 8\)$"),
        (_duplicated("json"), "json", r"^f: key 'quick' appears twice in one object$"),
        (_duplicated("json"), None, r"^f: key 'quick' appears twice in one object$"),
    ],
)
def test_undecodable_text_raises_one_line_of_profile_error(
    text: str | bytes, fmt: str | None, message: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ProfileError, match=message) as raised:
        parse_profile_text(text, source="f", fmt=fmt)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)
    assert time.monotonic() - started < 5


def test_a_profile_file_is_read_bounded(tmp_path: Path) -> None:
    good = tmp_path / "h100.yaml"
    good.write_text(dump_profile(gpu_profile(), "yaml"))
    assert load_profile(good) == gpu_profile()
    sniffed = tmp_path / "h100.profile"
    sniffed.write_text(dump_profile(gpu_profile()))
    assert load_profile(sniffed, source="key") == gpu_profile()
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_PROFILE_BYTES + 1))
    cases = {
        big: f"{big}: larger than 1 MiB (the limit)",
        tmp_path / "absent.json": "absent.json: cannot read it: No such file or directory",
        Path("/dev/urandom"): "urandom: not a regular file (a character device)",
    }
    for path, message in cases.items():
        with pytest.raises(ProfileError) as raised:
            load_profile(path, source=path.name if path.name != "big.json" else None)
        assert str(raised.value) == message


def test_deeply_nested_values_inside_a_valid_shape_are_refused() -> None:
    document = _document()
    nested: Any = {}
    for _ in range(50_000):
        nested = {"skipped": nested}
    document["matmul"]["tf32"] = nested
    with pytest.raises(ProfileError):
        parse_profile(document)


def test_skipped_and_figure_types() -> None:
    profile = parse_profile(json.loads(dump_profile(gpu_profile())))
    assert isinstance(profile.matmul["fp8"], Skipped)
    assert isinstance(profile.launch_cuda_graph, Figure)
    assert yaml.safe_load(dump_profile(profile, "yaml"))["model"] == "NVIDIA H100 80GB HBM3"
