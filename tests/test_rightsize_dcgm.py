"""`gpuscope rightsize --source dcgm-exporter` on a real Prometheus holding a week of
dcgm-exporter and kube-state-metrics history only (`tests/dcgm_history_data.py`): 4.8's and 4.9's
names, the plain and the `exported_*` pod labels, each with its known answers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.dcgm_history_data import ANSWERS, END, FORMS, backfilled, namespace
from tests.prometheus_server import running_prometheus
from tests.rightsize_run import rightsize

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("dcgm-prometheus")
    with running_prometheus(backfilled(root)) as url:
        yield url


def report(prometheus: str, *args: str) -> dict[str, Any]:
    result = rightsize(
        "--prometheus", prometheus, f"--end={END}", "--window=7d", "--format=json", *args
    )
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


@pytest.fixture(scope="module")
def document(prometheus: str) -> dict[str, Any]:
    return report(prometheus, "--source=dcgm-exporter")


def rows(document: dict[str, Any], form: str) -> dict[str, dict[str, Any]]:
    return {w["workload"]: w for w in document["workloads"] if w["namespace"] == namespace(form)}


@pytest.mark.parametrize("form", FORMS)
def test_each_name_version_and_label_form_gives_the_known_answers(
    document: dict[str, Any], form: str
) -> None:
    workloads = rows(document, form)
    answers = {
        name: (w["classification"], w["recommended"])
        for name, w in workloads.items()
        if name in ANSWERS
    }
    assert answers == ANSWERS
    # The underused A100 goes to a MIG slice of its own model.
    chat = workloads["chat"]
    assert chat["classification"] == "underused"
    assert chat["kind"] == "Deployment", "kube_pod_owner -> kube_replicaset_owner"
    assert chat["target"]["model"] == "A100 80GB SXM"
    assert chat["target"]["mig_profile"] is not None
    assert 0.08 < chat["usage"]["utilization_mean"] < 0.12, "4.8's % and 4.9's ratio alike"
    assert 5.5 < chat["usage"]["memory_peak_bytes"] / 1024**3 < 6.5, "MiB and bytes alike"
    # The 2-GPU Job whose second GPU idled: one GPU per replica, in the JSON and the patch.
    finetune = workloads["finetune"]
    assert (finetune["kind"], finetune["gpus_per_replica"], finetune["recommended_gpus"]) == (
        "Job",
        2,
        1,
    )
    (container,) = finetune["patch"]["body"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "main"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert workloads["notebook"]["recommended_gpus"] == 0
    # Nothing dcgm-exporter alone tells is trusted highly.
    assert {w["confidence"] for w in workloads.values()} <= {"medium", "low"}


def test_only_pods_that_asked_for_a_gpu_hold_one(document: dict[str, Any]) -> None:
    # The exported_* form puts the exporter's own pod on an unheld GPU's series; it asked for no
    # GPU (kube-state-metrics), so it is nobody's workload.
    namespaces = {w["namespace"] for w in document["workloads"]}
    assert namespaces == {namespace(form) for form in FORMS}
    assert document["history_source"] == "dcgm-exporter"


def test_what_dcgm_exporter_cannot_tell_is_said_in_words(document: dict[str, Any]) -> None:
    missing = document["missing_signals"]
    assert any(text.startswith("calibration:") for text in missing)
    assert any(text.startswith("SM activity: DCGM_FI_PROF_SM_ACTIVE") for text in missing)
    assert any(text.startswith("CPU use against its limit") for text in missing)
    (shared,) = [text for text in missing if text.startswith("per-process data:")]
    assert "before 4.8.2" in shared
    # The two pods time-slicing one GPU are the ones it names, and they share its cost.
    tts = rows(document, "48-plain")["tts"]
    assert tts["usage"]["shared"] is True
    assert tts["current"]["shared_by"] == 2
    assert tts["confidence"] != "high"
    assert "at most medium from dcgm-exporter's series" in tts["confidence_reason"] or (
        tts["confidence"] == "low"
    )


def test_auto_picks_dcgm_exporter_and_logs_why(prometheus: str) -> None:
    result = rightsize(
        "--prometheus",
        prometheus,
        f"--end={END}",
        "--window=7d",
        "--source=auto",
        "--format=markdown",
    )
    assert result.returncode == 0, result.stderr
    assert "source chosen" in result.stderr
    assert "source=dcgm-exporter" in result.stderr
    assert "no gpu_allocation_info" in result.stderr
    # Markdown (as HTML and the terminal's table) names what was missing.
    assert "Missing signals: calibration:" in result.stdout
    assert "per-process data:" in result.stdout
    table = rightsize(
        "--prometheus", prometheus, f"--end={END}", "--window=7d", "--source=dcgm-exporter"
    )
    assert "Missing signals: calibration:" in " ".join(table.stdout.split())


def test_the_gpuscope_source_finds_none_of_it(prometheus: str) -> None:
    document = report(prometheus)
    assert document["workloads"] == []
    assert document["history_source"] == "gpuscope"
