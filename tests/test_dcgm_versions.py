"""`--compat.dcgm-version=4.9`: dcgm-exporter 4.9.0's default field set, names, base units and
labels from the same readings as 4.8's, shared GPUs split the same way; the setting, and the
counters files of either version."""

from __future__ import annotations

import asyncio
import math
import subprocess
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import pytest

from exporter.config import ConfigError, load
from exporter.dcgm import NOT_SERVED, VERSION_48, VERSION_49, VERSIONS, Field
from exporter.dcgm_counters import ADDED_IN_49, RENAMED_IN_49, read_counters
from exporter.metrics.dcgm import DcgmCompat
from exporter.metrics.exposition import TEXT
from exporter.model import CollectorStatus, GpuIdentity, GpuSample, Snapshot
from exporter.readings.device import TEMPERATURE
from exporter.readings.events import xid_series
from tests.dcgm_fleet import dcgm_exposition, dcgm_series, declared_types
from tests.helpers import ROOT, daemon_command, series

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)

COUNTERS_48: Final = ROOT / "tests" / "fixtures" / "dcgm" / "default-counters.csv"
COUNTERS_49: Final = ROOT / "tests" / "fixtures" / "dcgm" / "default-counters-4.9.csv"
TO_49: Final = {
    "DCGM_FI_DEV_SM_CLOCK": 1e6,
    "DCGM_FI_DEV_MEM_CLOCK": 1e6,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e-3,
    "DCGM_FI_DEV_GPU_UTIL": 0.01,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 0.01,
    "DCGM_FI_DEV_ENC_UTIL": 0.01,
    "DCGM_FI_DEV_DEC_UTIL": 0.01,
    "DCGM_FI_DEV_FB_FREE": 2.0**20,
    "DCGM_FI_DEV_FB_USED": 2.0**20,
    "DCGM_FI_DEV_FB_RESERVED": 2.0**20,
}
"""4.9.0's unit over 4.8's, written out here (not taken from the code under test): MHz → Hz,
mJ → J, % → 0-1, MiB → bytes. Every other renamed field keeps its value."""
RELABEL: Final = {"Hostname": "hostname", "DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION"}


def _text(version: str) -> str:
    return asyncio.run(dcgm_exposition(version=version)).render(TEXT).body.decode()


@pytest.fixture(scope="module")
def served() -> dict[str, str]:
    return {version: _text(version) for version in VERSIONS}


# -- the declarations ----------------------------------------------------------------------------


def test_49s_defaults_are_its_counters_file_but_what_gpuscope_cannot_serve() -> None:
    rows = read_counters(COUNTERS_49).rows
    listed = [row.field for row in rows if row.field not in NOT_SERVED]
    assert [field.name for field in VERSION_49.default_fields] == listed
    kinds = {row.field: row.kind for row in rows}
    for field in VERSION_49.default_fields:
        assert field.kind == kinds[field.name], field.name
    assert len(RENAMED_IN_49) == 23
    assert sum(new.unit != old.unit for old, new in _pairs()) == 11, "4.9.0's notes: 11"


def test_no_renamed_48_name_is_a_49_field_and_the_others_are_shared() -> None:
    names = set(VERSION_49.by_name)
    assert not names & set(RENAMED_IN_49)
    assert set(RENAMED_IN_49.values()) | set(ADDED_IN_49) <= names
    kept = {field.name for field in VERSION_48.fields} - set(RENAMED_IN_49)
    assert kept <= names
    assert len(VERSION_49.fields) == len(VERSION_48.fields) + len(ADDED_IN_49)


def test_a_49_field_reads_the_same_series_in_gpuscopes_base_unit() -> None:
    for old, new in _pairs():
        if new.summed:
            continue  # NVLink's throughput: a rate, where 4.8 serves a byte counter
        assert [s.series for s in new.sources] == [s.series for s in old.sources], new.name
        assert new.split == old.split, new.name
        expected = TO_49.get(old.name, 1.0)
        for before, after in zip(old.sources, new.sources, strict=True):
            assert math.isclose(after.factor, before.factor * expected), new.name


def _pairs() -> list[tuple[Field, Field]]:
    return [
        (VERSION_48.by_name[old], VERSION_49.by_name[new]) for old, new in RENAMED_IN_49.items()
    ]


# -- what the golden fleet with pods serves ------------------------------------------------------


def test_49_serves_its_names_and_labels_and_none_of_48s(served: dict[str, str]) -> None:
    text = served["4.9"]
    types = declared_types(text)
    assert set(types) == {f.name for f in VERSION_49.default_fields if f.kind != "label"}
    for name, labels, _ in dcgm_series(text):
        assert "hostname" in labels, name
        assert "Hostname" not in labels, name
        assert labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "570.133.20", name
        assert "DCGM_FI_DRIVER_VERSION" not in labels, name
    for old in RENAMED_IN_49:
        assert f"{old}{{" not in text, old


def test_each_49_value_is_48s_in_base_units_on_the_same_series(served: dict[str, str]) -> None:
    old_series: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for name, labels, number in dcgm_series(served["4.8"]):
        renamed = frozenset((RELABEL.get(key, key), value) for key, value in labels.items())
        old_series[RENAMED_IN_49.get(name, name), renamed] = number
    compared = 0
    for name, labels, number in dcgm_series(served["4.9"]):
        if name in {"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", "DCGM_FI_DEV_FB_CAPACITY_BYTES"}:
            continue
        old = {new: old for old, new in RENAMED_IN_49.items()}.get(name, name)
        before = old_series.pop((name, frozenset(labels.items())))
        # 4.8 prints six decimals: a MiB value is off by at most 1e-6 MiB, about one byte
        assert math.isclose(number, before * TO_49.get(old, 1.0), rel_tol=1e-9, abs_tol=2.0)
        compared += 1
    leftover = {name for name, _ in old_series}
    assert leftover == {"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL"}, (
        "every other series has its 4.9 twin"
    )
    assert compared > 100


def test_49_splits_shared_gpus_per_pod_adding_up_to_the_device(served: dict[str, str]) -> None:
    text = served["4.9"]
    for field, device_family in (
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "gpu_utilization_ratio"),
        ("DCGM_FI_DEV_FB_USED_BYTES", "gpu_memory_used_bytes"),
    ):
        by_gpu: dict[str, float] = defaultdict(float)
        pods: dict[str, set[str]] = defaultdict(set)
        for _, labels, number in dcgm_series(text, field):
            if labels.get("GPU_I_ID"):
                continue
            by_gpu[labels["UUID"]] += number
            pods[labels["UUID"]].add(labels["pod"])
        assert pods["GPU-5a1e0001-04d2-4c01-8000-000000971414"] == {
            "embed-7d9c8b6f5-aaaaa",
            "rank-7d9c8b6f5-bbbbb",
            "",
        }, "the shared L4: one series per pod, and the rest without pod labels"
        for uuid, total in by_gpu.items():
            (device,) = series(text, device_family, uuid=uuid).values()
            assert math.isclose(total, device, rel_tol=1e-6, abs_tol=1e-6), (field, uuid)


def test_fb_capacity_is_the_total_in_bytes(served: dict[str, str]) -> None:
    for _, labels, number in dcgm_series(served["4.9"], "DCGM_FI_DEV_FB_CAPACITY_BYTES"):
        if labels.get("GPU_I_ID"):
            continue
        (total,) = series(served["4.9"], "gpu_memory_total_bytes", uuid=labels["UUID"]).values()
        assert number == total


def test_a_gpu_that_is_down_keeps_49s_last_xid_and_nothing_else() -> None:
    gpu = GpuIdentity(0, "GPU-0", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", "570.1")
    compat = DcgmCompat(VERSION_49.default_fields, hostname="node-a", version=VERSION_49)
    events = (CollectorStatus("events", success=True, duration_seconds=None),)
    values = {xid_series(79): 1.0, TEMPERATURE: 40.0}
    down = Snapshot(0.0, (GpuSample(gpu, up=False, values=values),), events)
    served = {m.name: m.samples for m in compat.families(down) if m.samples}
    assert list(served) == ["DCGM_FI_DEV_XID_ERROR"]
    (xid,) = served["DCGM_FI_DEV_XID_ERROR"]
    assert (xid.value, xid.labels["err_code"], xid.labels["hostname"]) == (79.0, "79", "node-a")


# -- the setting ---------------------------------------------------------------------------------


def test_the_version_is_a_setting_like_its_siblings(tmp_path: Path) -> None:
    assert load({"compat_dcgm": "true"}, environ={}).dcgm_version == "4.8"
    assert load({"compat_dcgm": "true", "dcgm_version": "4.9"}, environ={}).dcgm_version == "4.9"
    environ = {"GPUSCOPE_COMPAT_DCGM": "true", "GPUSCOPE_COMPAT_DCGM_VERSION": "4.9"}
    assert load({}, environ=environ).dcgm_version == "4.9"
    file = tmp_path / "gpuscope.yaml"
    file.write_text("compat:\n  dcgm: true\n  dcgm-version: 4.9\n")  # YAML reads a float
    config = load({"config_file": str(file)}, environ={})
    assert config.dcgm_version == "4.9"
    compat = DcgmCompat.from_config(replace(config, node_name="node-c"))
    assert compat is not None
    assert compat.version is VERSION_49
    assert [f.name for f in compat.fields] == [
        f.name for f in VERSION_49.default_fields if f.kind != "label"
    ]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (
            {"compat_dcgm": "true", "dcgm_version": "5.0"},
            "invalid --compat.dcgm-version: '5.0' is not one of 4.8, 4.9",
        ),
        (
            {"dcgm_version": "4.9"},
            "invalid --compat.dcgm-version: it chooses what --compat.dcgm serves, and that is off",
        ),
    ],
)
def test_a_bad_version_is_one_line(flags: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(flags, environ={})
    assert str(raised.value) == problem


def test_an_unknown_version_stops_the_daemon_with_one_line() -> None:
    result = subprocess.run(
        daemon_command(
            "--simulate=1",
            "--web.listen-address=127.0.0.1:0",
            "--compat.dcgm",
            "--compat.dcgm-version=4.10",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line == "gpuscope: error: invalid --compat.dcgm-version: '4.10' is not one of 4.8, 4.9"


# -- counters files ------------------------------------------------------------------------------


def test_49s_own_counters_file_serves_its_defaults() -> None:
    config = load(
        {"compat_dcgm": "true", "dcgm_version": "4.9", "dcgm_counters": str(COUNTERS_49)},
        environ={},
    )
    compat = DcgmCompat.from_config(replace(config, node_name="node-c"))
    assert compat is not None
    assert compat.fields == tuple(f for f in VERSION_49.default_fields if f.kind != "label")


@pytest.mark.parametrize(
    ("version", "counters", "problem"),
    [
        (
            "4.9",
            COUNTERS_48,
            (
                f"{COUNTERS_48}:5: DCGM_FI_DEV_SM_CLOCK is dcgm-exporter 4.8's name; 4.9 serves it as "
                "DCGM_FI_DEV_SM_CLOCK_HERTZ (rename the row, or serve 4.8 with "
                "--compat.dcgm-version=4.8)"
            ),
        ),
        (
            "4.8",
            COUNTERS_49,
            (
                f"{COUNTERS_49}:11: DCGM_FI_DEV_SM_CLOCK_HERTZ is dcgm-exporter 4.9's name; 4.8 serves "
                "it as DCGM_FI_DEV_SM_CLOCK (rename the row, or serve 4.9 with "
                "--compat.dcgm-version=4.9)"
            ),
        ),
    ],
)
def test_the_other_versions_counters_file_is_refused_naming_the_row_and_the_name(
    version: str, counters: Path, problem: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load(
            {"compat_dcgm": "true", "dcgm_version": version, "dcgm_counters": str(counters)},
            environ={},
        )
    assert str(raised.value) == f"invalid --compat.dcgm-counters: {problem}"


@pytest.mark.parametrize(
    ("version", "row", "named"),
    [
        ("4.9", "DCGM_FI_DRIVER_VERSION, label, Driver Version", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
        ("4.8", "DCGM_FI_DEV_FB_CAPACITY_BYTES, gauge, Total.", "DCGM_FI_DEV_FB_TOTAL"),
        ("4.8", "DCGM_FI_DEV_XID_ERROR, gauge, Last XID.", "DCGM_FI_DEV_XID_ERRORS"),
    ],
)
def test_a_single_row_of_the_other_version_is_refused(
    tmp_path: Path, version: str, row: str, named: str
) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(f"DCGM_FI_PROF_PCIE_TX_BYTES, gauge, PCIe TX.\n{row}\n")
    flags = {"compat_dcgm": "true", "dcgm_version": version, "dcgm_counters": str(path)}
    with pytest.raises(ConfigError, match=rf"{path}:2: .* serves it as {named} "):
        load(flags, environ={})
