"""dcgm-exporter's series (`--compat.dcgm`): the declarations, what the golden fleet with pods
serves — every field's name, type, unit (against gpuscope's own series) and labels, the split of
shared GPUs — the counters file, and nothing at all without the flag."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import pytest

from exporter.config import ConfigError, ServeConfig, load
from exporter.dcgm import (
    BY_NAME,
    DEFAULT_FIELDS,
    DRIVER_VERSION,
    FIELDS,
    NOT_SERVED,
    XID_ERRORS,
    Field,
    xid_message,
)
from exporter.dcgm.xids import TEXTS, XidCatalogError, load_catalog
from exporter.dcgm_counters import COUNTERS_LIMIT, read_counters
from exporter.metrics.dcgm import DcgmCompat
from exporter.metrics.exposition import OPENMETRICS, TEXT
from exporter.model import GpuIdentity, GpuSample, PodIdentity, PodUsage, Snapshot, Unattributed
from exporter.readings.clocks import CLOCK_EVENT_REASONS
from exporter.readings.device import COMPUTE_MODES, MEMORY_USED, UTILIZATION
from exporter.readings.gpm import GRAPHICS_ACTIVE
from tests.dcgm_fleet import NODE, dcgm_exposition, dcgm_series, declared_types
from tests.golden_fleet import render_fleet
from tests.helpers import ROOT, series, value

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.series import Series

pytestmark = pytest.mark.timeout(60)

COUNTERS: Final = ROOT / "tests" / "fixtures" / "dcgm" / "default-counters.csv"
DEFAULT_COUNTERS: Final = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
"""dcgm-exporter 4.x's default counters (etc/default-counters.csv), in its order."""
EXPECTED_KINDS: Final = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DRIVER_VERSION": "label",
}
"""dcgm-exporter's declared type of each default field that is not a gauge."""
GPU_LABELS: Final = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
POD_LABELS: Final = {"namespace", "pod", "container"}
MIB: Final = 2**20


@pytest.fixture(scope="module")
def every_field(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The golden fleet with pods, serving every field gpuscope knows (a counters file listing
    them all)."""
    path = tmp_path_factory.mktemp("dcgm") / "every-field.csv"
    path.write_text(
        "".join(f'{field.name}, {field.kind}, "{field.help}"\n' for field in FIELDS),
        encoding="utf-8",
    )
    exposition = asyncio.run(dcgm_exposition(read_counters(path)))
    return exposition.render(TEXT).body.decode()


@pytest.fixture(scope="module")
def defaults() -> str:
    return asyncio.run(dcgm_exposition()).render(TEXT).body.decode()


# -- the declarations ----------------------------------------------------------------------------


def test_every_default_field_is_served_or_said_why_not() -> None:
    served = [field.name for field in DEFAULT_FIELDS]
    assert [name for name in DEFAULT_COUNTERS if name not in NOT_SERVED] == served
    assert set(NOT_SERVED) <= set(DEFAULT_COUNTERS)
    assert not set(NOT_SERVED) & set(BY_NAME)
    for field in DEFAULT_FIELDS:
        assert field.kind == EXPECTED_KINDS.get(field.name, "gauge"), field.name


def test_each_field_is_made_from_declared_series() -> None:
    names = [field.name for field in FIELDS]
    assert len(names) == len(set(names))
    for field in FIELDS:
        assert field.name.startswith("DCGM_FI_")
        assert field.help
        assert field.kind in {"gauge", "counter", "label"}
        made = bool(field.sources) + bool(field.bits) + bool(field.totals) + bool(field.modes)
        if field.name in {XID_ERRORS, DRIVER_VERSION}:
            assert not made, field.name
            assert field.derived, field.name
        else:
            assert made == 1, f"{field.name}: exactly one of sources, bits, totals, modes"
        assert field.kind != "label" or field.name == DRIVER_VERSION
        assert field.split is None or field.kind == "gauge"


def test_xid_messages_are_nvidias() -> None:
    assert xid_message(0) == "No Error"
    assert xid_message(13) == "Graphics Engine Exception"
    assert xid_message(48) == "Double Bit ECC Error"
    assert xid_message(79) == "GPU has fallen off the bus"
    assert xid_message(126) == "Robust Channel CE10 Error"
    assert xid_message(136) == "ALI Training Fail"
    assert xid_message(172) == "Uncorrectable SRAM Error"
    assert xid_message(173) == xid_message(-1) == "Unknown Error"
    assert xid_message(70) == "CE3: Unknown Error", "a text with a colon, quoted in the YAML"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- No Error\n", "xids.yaml: expected a mapping of XID to text, got a list"),
        ("{}\n", "xids.yaml: lists no XID"),
        ("0: No Error\n2: Unused\n", "xids.yaml: XID 2: expected XID 1 here"),
        ("1: No Error\n", "xids.yaml: XID 1: expected XID 0 here"),
        ("0: No Error\nnext: Unused\n", "xids.yaml: XID 'next': expected a whole number"),
        ("0: No Error\n1: ''\n", "xids.yaml: XID 1: must not be empty"),
        ("0: No Error\n1: [Unused]\n", "xids.yaml: XID 1: expected a string, got a list"),
        ("0: No Error\n0: Unused\n", "xids.yaml: key 0 appears twice in one mapping (line 2)"),
    ],
)
def test_the_xid_catalog_is_refused_where_it_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(XidCatalogError) as refused:
        load_catalog(text.encode())
    assert str(refused.value).startswith(problem)
    assert "\n" not in str(refused.value)


def test_the_shipped_xid_catalog_lists_every_xid_from_0() -> None:
    shipped = (ROOT / "exporter" / "dcgm" / "xids.yaml").read_bytes()
    assert load_catalog(shipped) == TEXTS
    assert len(TEXTS) == 173
    assert [xid_message(xid) for xid in range(len(TEXTS))] == list(TEXTS)


# -- what the golden fleet serves ---------------------------------------------------------------


def _own_value(text: str, family: str, labels: dict[str, str], dcgm: dict[str, str]) -> float:
    """gpuscope's own value of a series for the GPU (or MIG instance) a DCGM series names."""
    where = {"gpu": dcgm["gpu"], **labels}
    if "GPU_I_ID" in dcgm:
        where["gpu_instance"] = dcgm["GPU_I_ID"]
    found = [
        number
        for key, number in series(text, family, **where).items()
        if "GPU_I_ID" in dcgm or "gpu_instance" not in dict(key)
    ]
    assert len(found) == 1, (family, where, found)
    return found[0]


def _device_value(text: str, field: Field, dcgm: dict[str, str]) -> float:
    """What the DCGM field must be for the GPU a DCGM series names, from gpuscope's series."""
    if field.bits:
        return float(
            sum(
                bit
                for bit, reason in CLOCK_EVENT_REASONS
                if _own_value(text, "gpu_clock_event_active", {"reason": reason}, dcgm)
            )
        )
    if field.totals:
        return sum(
            number
            for total in field.totals
            for key, number in series(
                text, total.family.exposed_name, gpu=dcgm["gpu"], **dict(total.labels)
            ).items()
            if "gpu_instance" not in dict(key)
        )
    if field.modes:
        (mode,) = [
            dict(key)["mode"]
            for key, number in series(text, "gpu_compute_mode_info", gpu=dcgm["gpu"]).items()
            if number == 1 and "gpu_instance" not in dict(key)
        ]
        return float(next(n for n, name in COMPUTE_MODES.items() if name == mode))
    for source in field.sources:  # the first the GPU gives
        where = {
            "gpu": dcgm["gpu"],
            **({"gpu_instance": dcgm["GPU_I_ID"]} if "GPU_I_ID" in dcgm else {}),
        }
        present = [
            number
            for key, number in series(
                text, source.series.family.exposed_name, **where, **dict(source.series.labels)
            ).items()
            if "GPU_I_ID" in dcgm or "gpu_instance" not in dict(key)
        ]
        if present:
            return (
                _own_value(
                    text, source.series.family.exposed_name, dict(source.series.labels), dcgm
                )
                * source.factor
            )
    raise AssertionError(f"{field.name}: no source for {dcgm}")


def _by_device(
    samples: list[tuple[str, dict[str, str], float]],
) -> dict[tuple[str, str], list[tuple[dict[str, str], float]]]:
    grouped: dict[tuple[str, str], list[tuple[dict[str, str], float]]] = defaultdict(list)
    for _, labels, number in samples:
        grouped[labels["gpu"], labels.get("GPU_I_ID", "")].append((labels, number))
    return grouped


def test_every_field_is_named_typed_labelled_and_converted_as_dcgm_exporter(
    every_field: str,
) -> None:
    types = declared_types(every_field)
    for field in FIELDS:
        if field.kind == "label":
            continue
        samples = dcgm_series(every_field, field.name)
        assert samples, f"{field.name}: the golden fleet serves it for at least one GPU"
        assert types[field.name] == field.kind, field.name
        for _, labels, _ in samples:
            extra = {"GPU_I_PROFILE", "GPU_I_ID"} if "GPU_I_ID" in labels else set()
            extra |= {"err_code", "err_msg"} if field.name == XID_ERRORS else set()
            assert set(labels) == GPU_LABELS | POD_LABELS | {DRIVER_VERSION} | extra
            assert labels["Hostname"] == NODE
            assert labels["device"] == f"nvidia{labels['gpu']}"
            assert labels[DRIVER_VERSION] == "570.133.20"
            assert labels["UUID"].startswith("GPU-"), "a MIG instance names its parent"
        if field.name == XID_ERRORS:
            continue
        for device, found in _by_device(samples).items():
            expected = _device_value(every_field, field, found[0][0])
            total = sum(number for _, number in found)
            assert total == pytest.approx(expected, rel=1e-6, abs=1e-6), (field.name, device)


def test_the_defaults_are_served_without_a_counters_file(defaults: str) -> None:
    served = set(declared_types(defaults))
    assert served == {field.name for field in DEFAULT_FIELDS if field.kind != "label"}
    assert f'{DRIVER_VERSION}="570.133.20"' in defaults
    assert "DCGM_FI_DEV_FB_TOTAL" not in defaults, "not a default: only from a counters file"


def test_units_are_dcgms(defaults: str) -> None:
    """A few values by hand: MHz, MiB, W, mJ, %, ratios."""
    trainer = {"gpu": "0"}
    sm = value(defaults, "gpu_clock_hertz", clock="sm", **trainer)
    (clock,) = [
        v for _, labels, v in dcgm_series(defaults, "DCGM_FI_DEV_SM_CLOCK") if labels["gpu"] == "0"
    ]
    assert clock == sm / 1e6
    (used,) = [
        v for _, labels, v in dcgm_series(defaults, "DCGM_FI_DEV_FB_USED") if labels["gpu"] == "0"
    ]
    assert used == value(defaults, "gpu_memory_used_bytes", **trainer) / MIB == 40 * 1024
    (energy,) = [
        v
        for _, labels, v in dcgm_series(defaults, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        if labels["gpu"] == "0"
    ]
    assert energy == pytest.approx(value(defaults, "gpu_energy_joules_total", **trainer) * 1000)
    (busy,) = [
        v for _, labels, v in dcgm_series(defaults, "DCGM_FI_DEV_GPU_UTIL") if labels["gpu"] == "0"
    ]
    (engine,) = [
        v
        for _, labels, v in dcgm_series(defaults, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        if labels["gpu"] == "0"
    ]
    assert busy == pytest.approx(100 * value(defaults, "gpu_utilization_ratio", **trainer))
    assert engine == pytest.approx(value(defaults, "gpu_graphics_active_ratio", **trainer))
    (older,) = [
        v
        for _, labels, v in dcgm_series(defaults, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        if labels["gpu"] == "5"
    ]
    assert older == pytest.approx(value(defaults, "gpu_utilization_ratio", gpu="5")), (
        "before Hopper: NVML's utilization"
    )
    assert 0 < engine <= 1
    for _, _, number in dcgm_series(defaults):
        assert number == round(number, 6), "six decimals at most, as dcgm-exporter prints them"


def test_a_gpu_one_pod_holds_carries_its_labels_on_every_series(defaults: str) -> None:
    for name, labels, _ in dcgm_series(defaults):
        if labels["gpu"] == "0":
            assert (labels["namespace"], labels["pod"], labels["container"]) == (
                "train",
                "trainer-0",
                "main",
            ), name
        if labels["gpu"] == "2":  # held, idle
            assert labels["pod"] == "notebook", name
    idle = [
        v for _, labels, v in dcgm_series(defaults, "DCGM_FI_DEV_GPU_UTIL") if labels["gpu"] == "2"
    ]
    assert idle == [0.0]


def test_mig_instances_carry_their_parents_identity_and_their_holder(defaults: str) -> None:
    parent = next(
        labels
        for _, labels, _ in dcgm_series(defaults)
        if labels["gpu"] == "4" and "GPU_I_ID" not in labels
    )
    instances = [
        labels
        for _, labels, _ in dcgm_series(defaults, "DCGM_FI_DEV_FB_USED")
        if "GPU_I_ID" in labels
    ]
    assert {labels["GPU_I_ID"] for labels in instances} == {"1", "2", "3"}
    for labels in instances:
        for name in ("gpu", "UUID", "device", "pci_bus_id", "modelName"):
            assert labels[name] == parent[name], name
    (held,) = [labels for labels in instances if labels["pod"]]
    assert (held["GPU_I_PROFILE"], held["GPU_I_ID"], held["namespace"], held["pod"]) == (
        "3g.40gb",
        "1",
        "serving",
        "llm-0",
    )
    assert not [
        labels
        for _, labels, _ in dcgm_series(defaults, "DCGM_FI_DEV_GPU_UTIL")
        if labels["gpu"] == "4"
    ], "no utilization in MIG mode: absent, as with DCGM"


def test_a_lost_gpu_keeps_only_its_last_xid(defaults: str) -> None:
    assert {name for name, labels, _ in dcgm_series(defaults) if labels["gpu"] == "3"} == {
        XID_ERRORS
    }


def test_a_shared_gpu_is_split_and_its_parts_add_up(every_field: str) -> None:
    """The L4 two pods share through MPS: what per-process samples split is one series per pod
    plus the rest without pod labels, adding up to the device's value; nothing else is ever on
    a pod of it."""
    text = every_field
    shared = {"gpu": "1"}
    device_util = value(text, "gpu_utilization_ratio", **shared)
    device_memory = value(text, "gpu_memory_used_bytes", **shared)
    wholes = {
        "DCGM_FI_DEV_GPU_UTIL": device_util * 100,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": device_util,
        "DCGM_FI_DEV_FB_USED": device_memory / MIB,
    }
    pods = {"embed-7d9c8b6f5-aaaaa", "rank-7d9c8b6f5-bbbbb"}
    for name, whole in wholes.items():
        found = {
            labels["pod"]: v for _, labels, v in dcgm_series(text, name) if labels["gpu"] == "1"
        }
        assert set(found) == pods | {""}, name
        assert sum(found.values()) == pytest.approx(whole, abs=1e-5), name
    for pod in pods:
        own = value(text, "gpu_pod_utilization_ratio", pod=pod, **shared)
        memory = value(text, "gpu_pod_memory_used_bytes", pod=pod, **shared)
        parts = {name: v for name, labels, v in dcgm_series(text) if labels["pod"] == pod}
        assert parts["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx(100 * own, abs=1e-5)
        assert parts["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(own, abs=1e-6)
        assert parts["DCGM_FI_DEV_FB_USED"] == memory / MIB
        assert set(parts) == set(wholes), "only split fields are on a sharing pod"
    for name, labels, _ in dcgm_series(text):
        if labels["gpu"] == "1" and name not in wholes:
            assert labels["pod"] == "", name


def test_no_device_value_is_on_two_pods(every_field: str) -> None:
    for field in FIELDS:
        grouped = _by_device(dcgm_series(every_field, field.name))
        for device, found in grouped.items():
            holders = [labels["pod"] for labels, _ in found if labels["pod"]]
            if field.split is None:
                assert len(found) == 1, (field.name, device)
            else:
                assert len(holders) == len(set(holders)), (field.name, device)


async def test_openmetrics_declares_dcgm_counters_unknown_and_keeps_their_names() -> None:
    text = (await dcgm_exposition()).render(OPENMETRICS).body.decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in text


# -- the split, on made-up snapshots ------------------------------------------------------------

_GPU: Final = GpuIdentity(
    0, "GPU-0", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", "570.1", minor_number=3
)


def _pod(name: str) -> PodIdentity:
    return PodIdentity("ns", name, f"uid-{name}", name, "Pod")


def _use(name: str, utilization: float | None, memory: int | None) -> PodUsage:
    return PodUsage(_pod(name), "main", _GPU, memory, utilization, None, 1)


class _Attribution:
    """The attribution parts the DCGM families read (the rest of `Attribution` is the pod
    watch's status, which they do not)."""

    def __init__(self, usage: tuple[PodUsage, ...], stray: int = 0, stray_memory: int = 0) -> None:
        self.usage = usage
        self.allocations = ()
        self.unattributed = (Unattributed(_GPU, stray, stray_memory),)


def _families(usage: tuple[PodUsage, ...], **values: float) -> dict[str, dict[str, float]]:
    sample = GpuSample(
        _GPU, up=True, values={UTILIZATION: values["util"], MEMORY_USED: values["used"]}
    )
    stray = int(values.get("stray", 0))
    snapshot = Snapshot(
        0.0,
        (sample,),
        (),
        attribution=_Attribution(usage, stray, stray * 1024),  # type: ignore[arg-type]
    )
    compat = DcgmCompat(DEFAULT_FIELDS, hostname="node-a")
    found: dict[str, dict[str, float]] = {}
    for metric in compat.families(snapshot):
        for sample_ in metric.samples:
            found.setdefault(metric.name, {})[sample_.labels["pod"]] = sample_.value
    return found


def test_mps_clients_whose_utilizations_overlap_are_scaled_down_to_the_device() -> None:
    found = _families((_use("a", 0.6, 2**30), _use("b", 0.6, 2**30)), util=0.8, used=3 * 2**30)
    assert found["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx({"a": 40.0, "b": 40.0, "": 0.0})
    assert found["DCGM_FI_DEV_FB_USED"] == {"a": 1024.0, "b": 1024.0, "": 1024.0}


def test_one_pod_beside_processes_outside_pods_is_split_too() -> None:
    found = _families((_use("a", 0.3, 2**30),), util=0.5, used=2 * 2**30, stray=1)
    assert found["DCGM_FI_DEV_GPU_UTIL"] == pytest.approx({"a": 30.0, "": 20.0})
    assert found["DCGM_FI_DEV_FB_USED"] == {"a": 1024.0, "": 1024.0}


def test_one_pod_alone_gets_the_device_values() -> None:
    found = _families((_use("a", 0.3, 2**30),), util=0.5, used=2 * 2**30)
    assert found["DCGM_FI_DEV_GPU_UTIL"] == {"a": 50.0}
    assert found["DCGM_FI_DEV_FB_USED"] == {"a": 2048.0}


def test_holders_without_samples_leave_the_device_value_unsplit() -> None:
    found = _families((_use("a", None, None), _use("b", None, None)), util=0.5, used=2**30)
    assert found["DCGM_FI_DEV_GPU_UTIL"] == {"a": 0.0, "b": 0.0, "": 50.0}
    assert found["DCGM_FI_DEV_FB_USED"] == {"a": 0.0, "b": 0.0, "": 1024.0}


def test_device_label_is_the_minor_number() -> None:
    compat = DcgmCompat(DEFAULT_FIELDS, hostname="node-a")
    sample = GpuSample(_GPU, up=True, values={UTILIZATION: 0.5})
    found = {m.name: m.samples for m in compat.families(Snapshot(0.0, (sample,), ())) if m.samples}
    assert set(found) == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    (util,) = found["DCGM_FI_DEV_GPU_UTIL"]
    assert util.labels["device"] == "nvidia3"
    assert util.labels["gpu"] == "0"
    assert math.isclose(util.value, 50.0)


def test_graphics_activity_never_stands_in_nvml_utilization_on_a_gpu_with_gpm() -> None:
    compat = DcgmCompat(DEFAULT_FIELDS, hostname="node-a")

    def engine(identity: GpuIdentity, values: dict[Series, float]) -> list[float]:
        sample = GpuSample(identity, up=True, values=values)
        found = {m.name: m.samples for m in compat.families(Snapshot(0.0, (sample,), ()))}
        return [s.value for s in found["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]]

    hopper = replace(_GPU, has_gpm=True)
    assert engine(hopper, {UTILIZATION: 0.5, GRAPHICS_ACTIVE: 0.4}) == [0.4]
    assert engine(hopper, {UTILIZATION: 0.5}) == [], "GPM skipped a cycle: absent, not NVML's"
    assert engine(_GPU, {UTILIZATION: 0.5}) == [0.5], "no GPM: NVML's utilization"


# -- off by default ------------------------------------------------------------------------------


async def test_without_the_flag_not_one_dcgm_series() -> None:
    text, openmetrics = await render_fleet()
    assert b"DCGM_" not in text
    assert b"DCGM_" not in openmetrics
    assert ServeConfig().compat_dcgm is False
    assert DcgmCompat.from_config(ServeConfig()) is None


# -- the counters file ---------------------------------------------------------------------------


def test_dcgm_exporters_own_format_reads(tmp_path: Path) -> None:
    counters = read_counters(COUNTERS)
    assert [row.field for row in counters.rows] == list(DEFAULT_COUNTERS)
    (dec,) = [row for row in counters.rows if row.field == "DCGM_FI_DEV_DEC_UTIL"]
    assert (dec.kind, dec.help) == ("gauge", "Decoder utilization (in %).")
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('DCGM_FI_DEV_GPU_UTIL, gauge, "GPU utilization, in %"\r\n')
    (row,) = read_counters(quoted).rows
    assert (row.help, row.line) == ("GPU utilization, in %", 1)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("DCGM_FI_DEV_GPU_UTIL, gauge\n", "bad.csv:1: expected 3 parts"),
        ("# ok\n\nDCGM_FI_DEV_GPU_UTIL, gauge, a, b\n", "bad.csv:3: expected 3 parts"),
        ("DCGM_FI_DEV_GPU_UTIL, gauges, help\n", "bad.csv:1: 'gauges' is not a type"),
        ("DCGM FI, gauge, help\n", "bad.csv:1: 'DCGM FI' is not a DCGM field name"),
        (
            "DCGM_FI_DEV_GPU_UTIL, gauge, a\nDCGM_FI_DEV_GPU_UTIL, gauge, b\n",
            "bad.csv:2: DCGM_FI_DEV_GPU_UTIL is listed twice (first on line 1)",
        ),
        ('DCGM_FI_DEV_GPU_UTIL, gauge, "open\n', "bad.csv:1: not a CSV row"),
        ("# nothing but comments\n", "bad.csv: lists no DCGM field"),
        (b"DCGM_FI_DEV_GPU_UTIL, gauge, \xff\n", "bad.csv: not UTF-8 text"),
        ("x" * (COUNTERS_LIMIT + 1), "bad.csv: larger than 256 KiB"),
    ],
)
def test_a_malformed_counters_file_is_one_line_naming_file_and_line(
    tmp_path: Path, content: str | bytes, problem: str
) -> None:
    path = tmp_path / "bad.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError) as raised:
        load({"compat_dcgm": "true", "dcgm_counters": str(path)}, environ={})
    message = str(raised.value)
    assert message.startswith("invalid --compat.dcgm-counters: ")
    assert f"{tmp_path}/{problem}" in message, message
    assert "\n" not in message
    assert len(message) < 400


def test_a_counters_file_needs_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--compat\.dcgm-counters: .* --compat\.dcgm serves"):
        load({"dcgm_counters": str(COUNTERS)}, environ={})
    config = load(
        {}, environ={"GPUSCOPE_COMPAT_DCGM": "true", "GPUSCOPE_COMPAT_DCGM_COUNTERS": str(COUNTERS)}
    )
    assert config.compat_dcgm is True
    assert config.dcgm_counters is not None
    file = tmp_path / "gpuscope.yaml"
    file.write_text(f"compat:\n  dcgm: true\n  dcgm-counters: {COUNTERS}\n")
    assert load({"config_file": str(file)}, environ={}).dcgm_counters == config.dcgm_counters


def test_the_file_chooses_the_fields_and_their_help_and_unknown_ones_are_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(
        "DCGM_FI_DEV_POWER_USAGE, gauge, Watts drawn.\n"
        "DCGM_FI_DEV_SOMETHING_NEW, gauge, Not a field gpuscope knows.\n"
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status\n"
        "DCGM_FI_DEV_GPU_UTIL, counter, GPU utilization (in %).\n"
        "DCGM_FI_DEV_FB_TOTAL, gauge, Total Frame Buffer of the GPU in MB\n"
    )
    config = load({"compat_dcgm": "true", "dcgm_counters": str(path)}, environ={})
    with caplog.at_level(logging.INFO, logger="exporter.metrics.dcgm"):
        compat = DcgmCompat.from_config(replace(config, node_name="node-b"))
    assert compat is not None
    assert compat.hostname == "node-b"
    assert [field.name for field in compat.fields] == [
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_TOTAL",
    ]
    ignored = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(r.field, r.at) for r in ignored] == [  # type: ignore[attr-defined]
        ("DCGM_FI_DEV_SOMETHING_NEW", f"{path}:2"),
        ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", f"{path}:3"),
    ]
    assert "vGPU" in ignored[1].why  # type: ignore[attr-defined]
    (retyped,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert (retyped.field, retyped.given, retyped.served) == (  # type: ignore[attr-defined]
        "DCGM_FI_DEV_GPU_UTIL",
        "counter",
        "gauge",
    )
    sample = GpuSample(_GPU, up=True, values={UTILIZATION: 0.5})
    (power, util, total) = compat.families(Snapshot(0.0, (sample,), ()))
    assert power.documentation == "Watts drawn."
    assert util.type == "gauge"
    assert not power.samples, "absent where the GPU gave nothing"
    assert not total.samples
    assert DRIVER_VERSION not in util.samples[0].labels, "a label only when the file lists it"
