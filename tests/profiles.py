"""Calibration test helpers: profiles built from the schema's own types, and PyTorch required the
way every optional tool is (`tests.helpers.unavailable`: a failure under CI=true, a skip
elsewhere)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any, NoReturn

import pytest

from exporter.calibration.profile import (
    BYTES_UNIT,
    SECONDS_UNIT,
    Conditions,
    Figure,
    Method,
    Profile,
    Reading,
    Skipped,
    Software,
    matmul_unit,
)
from exporter.catalog import DTYPES
from exporter.extras import install_hint
from tests.helpers import IN_CI, unavailable

PYTORCH_MISSING = f"PyTorch is not installed ({install_hint('calibrate')})"


def require_pytorch() -> None:
    """In a test that runs a calibration: PyTorch must be installed."""
    if importlib.util.find_spec("torch") is None:
        unavailable(PYTORCH_MISSING)


def pytorch_missing(error: ImportError) -> NoReturn:
    """At the top of a test module whose imports failed: skip (or, under CI=true, fail) the module
    if PyTorch is what is missing, else the error stands."""
    if (error.name or "").partition(".")[0] != "torch":
        raise error
    if IN_CI:
        pytest.fail(PYTORCH_MISSING, pytrace=False)
    pytest.skip(PYTORCH_MISSING, allow_module_level=True)


def figure(value: float, unit: str, *, datasheet: float | None = None, size: str = "") -> Figure:
    return Figure(
        value=value,
        unit=unit,
        minimum=value * 0.98,
        maximum=value * 1.01,
        trials=7,
        unstable=False,
        size=size,
        datasheet=datasheet,
    )


def gpu_profile(model: str = "NVIDIA H100 80GB HBM3", **changes: Any) -> Profile:
    """A plausible full-run profile of a GPU: bf16 at 80% of an H100's datasheet peak."""
    rates = {"fp64": 5.2e13, "fp32": 5.1e13, "tf32": 3.9e14, "fp16": 7.9e14, "bf16": 7.92e14}
    matmul = {
        dtype: (
            figure(rates[dtype], matmul_unit(dtype), size="8192x8192x8192")
            if dtype in rates
            else Skipped(f"{dtype} matmul is not supported here")
        )
        for dtype in DTYPES
    }
    reading = Reading(
        temperature_celsius=41.0,
        sm_clock_hertz=1.98e9,
        memory_clock_hertz=2.619e9,
        power_watts=82.5,
        clock_event_reasons=("gpu_idle",),
    )
    profile = Profile(
        model=model,
        catalog_key="h100-sxm",
        device="cuda",
        measured_at="2026-11-20T10:00:00Z",
        quick=False,
        duration_seconds=74.2,
        software=Software(
            gpuscope="0.1.0", torch="2.13.0", python="3.11.7", cuda="12.8", driver="570.133.20"
        ),
        method=Method(timer="cuda_events", warmup_seconds=0.5, trials=7, unstable_spread=0.1),
        conditions=Conditions(
            before=reading,
            after=replace(reading, temperature_celsius=67.0, clock_event_reasons=()),
        ),
        matmul=matmul,
        memory_copy=figure(3.0e12, BYTES_UNIT, datasheet=3.35e12, size="1024 MiB"),
        memory_read=figure(3.1e12, BYTES_UNIT, datasheet=3.35e12, size="1024 MiB"),
        host_to_device=figure(5.3e10, BYTES_UNIT, size="1024 MiB pinned"),
        device_to_host=figure(5.1e10, BYTES_UNIT, size="1024 MiB pinned"),
        launch_eager=figure(6.0e-6, SECONDS_UNIT, size="1 element"),
        launch_cuda_graph=figure(1.2e-6, SECONDS_UNIT, size="100 kernels"),
    )
    return replace(profile, **changes)
