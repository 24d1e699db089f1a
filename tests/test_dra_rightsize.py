"""`gpuscope rightsize` on GPUs held through DRA ResourceClaims answers as on device-plugin ones.

The rightsizing scenario (tests/rightsize_scenario.py) is backfilled twice into one real
Prometheus: as the device plugin hands the GPUs out, and — in namespaces prefixed `dra-`, on GPUs
of their own — as NVIDIA's DRA driver does, where `gpu_allocation_info` carries `claim` and
`claim_namespace` and the two time-sliced services share one claim. The job's report on each
copy must be the same, workload by workload: classification, recommendation, GPUs held, sharing,
cost and savings.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers import require_tool
from tests.prometheus_server import running_prometheus
from tests.rightsize_run import rightsize
from tests.rightsize_scenario import CALIBRATION, END, WORKLOADS
from tests.synthetic_history import backfill, write_openmetrics

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DAY = 86400
PREFIX = "dra-"
SHARED_CLAIM = "voice-gpu"
"""The claim the two time-sliced services (tts, asr) both reserve."""
DRA_WORKLOADS = [
    dataclasses.replace(
        workload,
        namespace=PREFIX + workload.namespace,
        shared_uuid=workload.shared_uuid and workload.shared_uuid + "-dra",
    )
    for workload in WORKLOADS
]
_INFO = re.compile(r"^gpu_allocation_info\{(?P<labels>[^}]*)\}")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def claimed(line: str) -> str:
    """A DRA copy's gpu_allocation_info sample with its claim's labels; any other line as is."""
    match = _INFO.match(line)
    if match is None:
        return line
    labels = dict(_LABEL.findall(match["labels"]))
    if not labels["namespace"].startswith(PREFIX):
        return line
    shared = labels["uuid"].endswith("-shared-dra")
    claim = SHARED_CLAIM if shared else f"{labels['pod']}-gpu-{labels['gpu']}"
    extra = f',claim="{claim}",claim_namespace="{labels["namespace"]}"'
    return f"{line[: match.end() - 1]}{extra}{line[match.end() - 1 :]}"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    promtool = require_tool("promtool")
    root = tmp_path_factory.mktemp("dra-rightsize")
    history = io.StringIO()
    write_openmetrics(
        history,
        [*WORKLOADS, *DRA_WORKLOADS],
        end=END,
        duration=14 * DAY + 3600,
        interval=300,
        calibration=CALIBRATION,
    )
    openmetrics = root / "history.om"
    with openmetrics.open("w") as out:
        for line in history.getvalue().splitlines(keepends=True):
            out.write(claimed(line))
    backfill(promtool, openmetrics, root / "data")
    openmetrics.unlink()
    with running_prometheus(root / "data") as url:
        yield url


def report(prometheus: str, *namespaces: str) -> dict[str, dict[str, Any]]:
    result = rightsize(
        "--prometheus",
        prometheus,
        f"--end={END}",
        "--format=json",
        f"--namespace={','.join(namespaces)}",
    )
    assert result.returncode == 0, result.stderr
    return {row["workload"]: row for row in json.loads(result.stdout)["workloads"]}


COMPARED = (
    "classification",
    "recommended",
    "gpus_held",
    "cost_current_usd_per_month",
    "cost_recommended_usd_per_month",
    "savings_usd_per_month",
)


def test_claims_are_in_the_history(prometheus: str) -> None:
    query = urllib.parse.urlencode(
        {"query": 'count by (claim) (gpu_allocation_info{claim!=""})', "time": str(END)}
    )
    with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=30) as answer:
        claims = {
            row["metric"]["claim"]: row["value"][1] for row in json.load(answer)["data"]["result"]
        }
    assert claims[SHARED_CLAIM] == "2", "one claim, two pods"
    assert len(claims) == 1 + sum(
        w.pods * w.gpus_per_pod for w in DRA_WORKLOADS if not w.shared_uuid
    )


def test_workloads_on_claimed_gpus_get_the_device_plugin_answers(prometheus: str) -> None:
    namespaces = sorted({w.namespace for w in WORKLOADS})
    plugin = report(prometheus, *namespaces)
    dra = report(prometheus, *(PREFIX + namespace for namespace in namespaces))
    assert set(dra) == set(plugin) == {w.name for w in WORKLOADS}
    for name, row in plugin.items():
        for field in COMPARED:
            expected = row[field]
            if isinstance(expected, float):
                expected = pytest.approx(expected, rel=1e-6)
            assert dra[name][field] == expected, (name, field)
        assert dra[name]["current"]["shared_by"] == row["current"]["shared_by"], name
    assert dra["tts"]["current"]["shared_by"] == 2, "the shared claim splits like time-slicing"
    assert dra["notebook-alice"]["classification"] == "idle", "an idle holder through a claim"
