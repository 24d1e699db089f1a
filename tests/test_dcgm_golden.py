"""The DCGM families of a golden /metrics with `--compat.dcgm`, as dcgm-exporter 4.8 and 4.9.0
name them (`--compat.dcgm-version`): the golden fleet with pods (tests/dcgm_fleet.py). gpuscope's own families beside them are tests/golden/metrics.prom's (the
pod rows' busy counters and collector durations follow the wall clock, so they stay out).

Any change to a DCGM field's name, type, help, labels or value shows up as a diff here. After an
intended change, regenerate with `pytest tests/test_dcgm_golden.py --update-golden` and review it.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from typing import Final

import pytest

from exporter.metrics.exposition import TEXT
from tests.dcgm_fleet import dcgm_exposition
from tests.helpers import ROOT, assert_promtool_accepts, require_tool

pytestmark = pytest.mark.timeout(60)

_DCGM: Final = re.compile(r"(# (HELP|TYPE) )?DCGM_FI_")
GOLDEN: Final = ROOT / "tests" / "golden" / "metrics-dcgm.prom"
GOLDENS: Final = {"4.8": GOLDEN, "4.9": ROOT / "tests" / "golden" / "metrics-dcgm-4.9.prom"}
DCGM_EXPORTERS_OWN: Final = (
    'counter metrics should have "_total" suffix',
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
)
"""What promtool's lint says of dcgm-exporter's names (DCGM_FI_DEV_PCIE_REPLAY_COUNTER, UUID,
modelName, counters without _total): kept as they are, since tools query them."""


def dcgm_families(text: str) -> str:
    """The `DCGM_FI_*` families of an exposition, as written."""
    return "".join(line + "\n" for line in text.splitlines() if _DCGM.match(line))


def gpuscope_families(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if not _DCGM.match(line))


async def render(version: str = "4.8") -> str:
    return (await dcgm_exposition(version=version)).render(TEXT).body.decode()


@pytest.mark.parametrize("version", sorted(GOLDENS))
async def test_metrics_match_the_golden_file(update_golden: bool, version: str) -> None:
    text = dcgm_families(await render(version))
    if update_golden:
        GOLDENS[version].write_text(text)
    assert text == GOLDENS[version].read_text(), "run pytest --update-golden and review the diff"


@pytest.mark.parametrize("version", sorted(GOLDENS))
async def test_rendering_is_deterministic(version: str) -> None:
    assert dcgm_families(await render(version)) == dcgm_families(await render(version))


@pytest.mark.parametrize("version", sorted(GOLDENS))
def test_gpuscopes_own_series_still_lint_clean_and_dcgms_only_for_its_names(version: str) -> None:
    text = asyncio.run(render(version))
    assert_promtool_accepts(gpuscope_families(text))
    result = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    problems = (result.stdout + result.stderr).decode().splitlines()
    assert problems, "promtool parses the whole exposition and lints dcgm-exporter's names"
    for line in problems:
        name, _, problem = line.partition(" ")
        assert name.startswith("DCGM_FI_"), line
        assert problem in DCGM_EXPORTERS_OWN, line


def test_golden_file_covers_every_shape() -> None:
    text = GOLDEN.read_text()
    for needle in (
        # the trainer alone on the H100: its labels on every series
        (
            'DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION="570.133.20",Hostname="golden-node",'
            'UUID="GPU-5a1e0000-04d2-4c00-8000-000000957afb",container="main",device="nvidia0",'
            'gpu="0",modelName="NVIDIA H100 80GB HBM3",namespace="train",'
            'pci_bus_id="00000000:18:00.0",pod="trainer-0"}'
        ),
        # the L4 two pods share: their parts, and the rest without pod labels
        'container="server",device="nvidia1",gpu="1",modelName="NVIDIA L4",namespace="serving"',
        'pod="rank-7d9c8b6f5-bbbbb"',
        'container="",device="nvidia1",gpu="1",modelName="NVIDIA L4",namespace="",',
        # a MIG instance held by a pod, under its parent's identity
        (
            'GPU_I_ID="1",GPU_I_PROFILE="3g.40gb",Hostname="golden-node",'
            'UUID="GPU-5a1e0004-04d2-4c04-8000-0000009bdf5f"'
        ),
        'err_code="0",err_msg="No Error"',
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
        "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{",
    ):
        assert needle in text, needle


def test_the_49_golden_file_covers_every_shape_in_49s_names() -> None:
    text = GOLDENS["4.9"].read_text()
    for needle in (
        (
            'DCGM_FI_DEV_GPU_TEMP_CELSIUS{DCGM_FI_SYSTEM_DRIVER_VERSION="570.133.20",'
            'UUID="GPU-5a1e0000-04d2-4c00-8000-000000957afb",container="main",device="nvidia0",'
            'gpu="0",hostname="golden-node",modelName="NVIDIA H100 80GB HBM3",namespace="train",'
            'pci_bus_id="00000000:18:00.0",pod="trainer-0"}'
        ),
        'container="server",device="nvidia1",gpu="1",hostname="golden-node",modelName="NVIDIA L4"',
        'GPU_I_ID="1",GPU_I_PROFILE="3g.40gb",UUID="GPU-5a1e0004-04d2-4c04-8000-0000009bdf5f"',
        'err_code="0",err_msg="No Error"',
        "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter",
        "\nDCGM_FI_DEV_FB_CAPACITY_BYTES{",
        "\nDCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL{",
    ):
        assert needle in text, needle
    assert "Hostname=" not in text
    assert "DCGM_FI_DRIVER_VERSION" not in text
