"""Ready-to-apply changes: each patch applied with the real `kubectl patch --local --type
strategic` to a manifest of its owner kind, the resource names the cluster uses, and the
`patches` directory format (files, apply.sh, quoting)."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from exporter.rightsize.cli import write_directory
from exporter.rightsize.formatters import DIRECTORIES, report_document
from exporter.rightsize.formatters.patches import MARK, SCRIPT, patch_files
from exporter.rightsize.history import ContainerCpu, History, ResourceUse
from exporter.rightsize.patches import build_patch, cpu_quantity
from exporter.rightsize.report import build_report
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.strategy import STRATEGIES
from tests.helpers import require_tool
from tests.rightsize_data import A100_40, A100_80, END, H100, WINDOW, device, hardware, workload

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.rightsize.history import WorkloadHistory

pytestmark = pytest.mark.timeout(120)

run = STRATEGIES["simple"].run
MIXED = (
    ResourceUse("", "nvidia.com/gpu", None),
    ResourceUse("", "nvidia.com/mig-3g.40gb", "3g.40gb"),
)
SINGLE = (ResourceUse("", "nvidia.com/gpu", None), ResourceUse("", "nvidia.com/gpu", "3g.40gb"))
WHOLE = (ResourceUse("", "nvidia.com/gpu", None),)


def pod_spec(resource: str = "nvidia.com/gpu", count: int = 1) -> dict[str, Any]:
    """Two containers (the GPU's and a sidecar), an existing node selector and toleration."""
    return {
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [
            {
                "name": "main",
                "image": "trainer:1",
                "resources": {
                    "limits": {resource: count, "cpu": "4", "memory": "16Gi"},
                    "requests": {resource: count, "cpu": "4", "memory": "16Gi"},
                },
            },
            {"name": "sidecar", "image": "proxy:1", "resources": {"limits": {"cpu": "1"}}},
        ],
    }


def manifest(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    metadata = {"name": name, "namespace": "team"}
    template = {"metadata": {"labels": {"app": name}}, "spec": spec}
    selector = {"matchLabels": {"app": name}}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": metadata,
            "spec": {"template": {**template, "spec": {**spec, "restartPolicy": "Never"}}},
        }
    if kind == "CronJob":
        job = {"template": {**template, "spec": {**spec, "restartPolicy": "Never"}}}
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": metadata,
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": job}},
        }
    body: dict[str, Any] = {"selector": selector, "template": template}
    if kind == "StatefulSet":
        body["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": metadata, "spec": body}


def kubectl_patch(tmp_path: Path, document: dict[str, Any], body: dict[str, Any]) -> Any:
    """The manifest after the real kubectl applied the patch to it, locally."""
    source, patch = tmp_path / "object.yaml", tmp_path / "patch.yaml"
    source.write_text(yaml.safe_dump(document))
    patch.write_text(yaml.safe_dump(body))
    result = subprocess.run(
        [
            require_tool("kubectl"),
            "patch",
            "--local",
            "-f",
            str(source),
            "--type",
            "strategic",
            "--patch-file",
            str(patch),
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def pod_of(document: dict[str, Any]) -> dict[str, Any]:
    kind = document["kind"]
    if kind == "Pod":
        spec: dict[str, Any] = document["spec"]
    elif kind == "CronJob":
        spec = document["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    else:
        spec = document["spec"]["template"]["spec"]
    return spec


def containers(document: dict[str, Any]) -> dict[str, Any]:
    return {container["name"]: container for container in pod_of(document)["containers"]}


def small(kind: str = "Deployment", **extra: Any) -> WorkloadHistory:
    """A workload on an A100 80GB at ~10%, 6 GiB: a 1g.10gb covers it."""
    extra.setdefault("container", "main")
    return workload(
        device(model=A100_80, busy=0.08, memory_gib=6, **extra),
        name="chat",
        namespace="team",
        kind=kind,
    )


@pytest.mark.parametrize(
    "kind", ["Deployment", "StatefulSet", "DaemonSet", "CronJob", "Job", "Pod"]
)
def test_a_move_to_a_mig_slice_applies_to_every_owner_kind(kind: str, tmp_path: Path) -> None:
    history = small(kind)
    recommendation = run(history, hardware(), StrategySettings())
    assert recommendation.target is not None
    assert recommendation.target.label == "A100 80GB SXM MIG 1g.10gb"
    patch = build_patch(history, recommendation, MIXED, [A100_80])
    assert patch is not None
    assert patch.body is not None
    assert patch.live == (kind not in {"Job", "Pod"})
    assert patch.changes == ("nvidia.com/gpu: 1 -> nvidia.com/mig-1g.10gb: 1",)
    # No pod holds a 1g.10gb yet (the cluster has 3g.40gb ones): partition first.
    assert "no pod holds nvidia.com/mig-1g.10gb yet" in patch.note
    after = kubectl_patch(tmp_path, manifest(kind, "chat", pod_spec()), patch.body)
    main = containers(after)["main"]
    for side in ("limits", "requests"):
        assert main["resources"][side] == {
            "nvidia.com/mig-1g.10gb": 1,
            "cpu": "4",
            "memory": "16Gi",
        }
    assert containers(after)["sidecar"] == pod_spec()["containers"][1]
    assert pod_of(after)["nodeSelector"] == {"pool": "gpu"}, "same model: no new selector"
    assert pod_of(after)["tolerations"] == pod_spec()["tolerations"]
    if kind == "Job":
        assert "cannot change once it is created" in patch.note
    if kind == "Pod":
        assert "re-create the pod" in patch.note


def test_release_removes_the_gpu_resource(tmp_path: Path) -> None:
    history = workload(
        device(busy=0.0, in_use_ratio=0.0, memory_gib=0, container="main"), name="notebook"
    )
    recommendation = run(history, hardware(), StrategySettings())
    assert recommendation.action == "release"
    patch = build_patch(history, recommendation, WHOLE)
    assert patch is not None
    assert patch.body is not None
    after = kubectl_patch(tmp_path, manifest("Deployment", "notebook", pod_spec()), patch.body)
    main = containers(after)["main"]
    assert main["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert main["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert patch.changes == ("nvidia.com/gpu: 1 -> removed",)


def test_a_cheaper_model_keeps_the_count_and_selects_the_product(tmp_path: Path) -> None:
    # Two H100s per pod at 15% with 30 GiB each: two A100 40GB cover it (no MIG for 2-GPU pods).
    history = workload(
        device(uuid="GPU-a", busy=0.15, memory_gib=30, container="main"),
        device(uuid="GPU-b", busy=0.15, memory_gib=30, container="main"),
        name="train",
    )
    recommendation = run(history, hardware(), StrategySettings(models=("a100-sxm4-40gb",)))
    assert recommendation.target is not None
    assert recommendation.target.model.key == "a100-sxm4-40gb", recommendation.reason
    patch = build_patch(history, recommendation, WHOLE, seen_models=[H100, A100_40])
    assert patch is not None
    assert patch.body is not None
    assert patch.changes == (
        "nvidia.com/gpu: 2 -> nvidia.com/gpu: 2",
        "nodeSelector nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB",
    )
    before = manifest("Deployment", "train", pod_spec(count=2))
    after = kubectl_patch(tmp_path, before, patch.body)
    assert pod_of(after)["nodeSelector"] == {
        "pool": "gpu",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    }
    assert containers(after)["main"]["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_an_input_bound_container_gets_cpu_requests_and_limits(tmp_path: Path) -> None:
    history = workload(
        device(model=A100_40, busy=0.4, busy_mean=0.35, container="main"),
        name="resnet",
        kind="CronJob",
        cpu=(ContainerCpu("main", 3.95, 4.0),),
    )
    recommendation = run(history, hardware(), StrategySettings())
    assert recommendation.action == "add CPU"
    patch = build_patch(history, recommendation, WHOLE)
    assert patch is not None
    assert patch.body is not None
    assert patch.live
    after = kubectl_patch(tmp_path, manifest("CronJob", "resnet", pod_spec()), patch.body)
    main = containers(after)["main"]
    assert main["resources"]["limits"]["cpu"] == "9500m"
    assert main["resources"]["requests"]["cpu"] == "9500m"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1, "the GPU stays"
    assert containers(after)["sidecar"]["resources"] == {"limits": {"cpu": "1"}}
    assert cpu_quantity(8.0) == "8"
    assert cpu_quantity(9.5) == "9500m"


def test_resource_names_follow_the_clusters_mig_strategy(tmp_path: Path) -> None:
    # A workload fit for a 3g.40gb on an H100 (the cluster holds H100 3g.40gb instances).
    history = workload(device(busy=0.3, memory_gib=25, container="main"), name="infer")
    settings = StrategySettings(models=("h100-sxm",))
    recommendation = run(history, hardware(), settings)
    assert recommendation.target is not None
    assert recommendation.target.label == "H100 SXM MIG 3g.40gb", recommendation.reason
    mixed = build_patch(history, recommendation, MIXED)
    assert mixed is not None
    assert mixed.body is not None
    assert mixed.changes == ("nvidia.com/gpu: 1 -> nvidia.com/mig-3g.40gb: 1",)
    assert mixed.note == ""
    single = build_patch(history, recommendation, SINGLE, seen_models=[H100])
    assert single is not None
    assert single.body is not None
    assert single.changes == (
        "nvidia.com/gpu: 1 -> nvidia.com/gpu: 1",
        "nodeSelector nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
    )
    assert "single strategy" in single.note
    after = kubectl_patch(tmp_path, manifest("Deployment", "infer", pod_spec()), single.body)
    assert pod_of(after)["nodeSelector"]["nvidia.com/gpu.product"] == (
        "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    )
    none = build_patch(history, recommendation, WHOLE)
    assert none is not None
    assert "no MIG instance is in use in this cluster" in none.note
    # A renamed time-slicing resource moved to a whole GPU of another model: the pod's own name
    # for whole GPUs is nvidia.com/gpu; a whole-GPU move of an exclusive renamed one keeps it.
    renamed = workload(
        device(busy=0.15, memory_gib=30, container="main", resource="example.com/gpu"),
        device(
            uuid="GPU-2", busy=0.15, memory_gib=30, container="main", resource="example.com/gpu"
        ),
        name="renamed",
    )
    moved = run(renamed, hardware(), StrategySettings(models=("a100-sxm4-40gb",)))
    patch = build_patch(renamed, moved, (ResourceUse("", "example.com/gpu", None),), [A100_40])
    assert patch is not None
    assert patch.changes[0] == "example.com/gpu: 2 -> example.com/gpu: 2"


def test_what_cannot_be_written_as_a_patch_says_what_to_change() -> None:
    ray = small("RayCluster")
    patch = build_patch(ray, run(ray, hardware(), StrategySettings()), MIXED)
    assert patch is not None
    assert patch.body is None
    assert "does not know where a RayCluster's pod template lives" in patch.note
    assert "nvidia.com/gpu: 1 -> nvidia.com/mig-1g.10gb: 1" in patch.note
    nameless = small(container="")
    patch = build_patch(nameless, run(nameless, hardware(), StrategySettings()), MIXED)
    assert patch is not None
    assert patch.body is None
    assert "does not name the container" in patch.note
    keep = workload(device(busy=0.97, memory_gib=70, container="main"), name="llm")
    assert build_patch(keep, run(keep, hardware(), StrategySettings()), MIXED) is None


def _report_of(*workloads: WorkloadHistory, resources: tuple[ResourceUse, ...] = MIXED) -> Any:
    history = History(
        end=END,
        window_seconds=WINDOW,
        step_seconds=300.0,
        quantile=0.95,
        workloads=workloads,
        resources=resources,
    )
    return build_report(
        history,
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="http://prometheus:9090",
    )


def test_the_patches_directory_and_apply_sh(tmp_path: Path) -> None:
    hostile = "x$(touch pwned)"
    report = _report_of(
        small(),
        small("Job", uuid="GPU-2"),
        replace(small(uuid="GPU-3"), name=hostile, namespace="ns;rm -rf"),
        workload(device(uuid="GPU-4", busy=0.97, memory_gib=70, container="main"), name="llm"),
        replace(small(uuid="GPU-5"), name="line\nbreak"),
    )
    assert DIRECTORIES["patches"] is patch_files
    files = patch_files(report)
    assert set(files) == {
        SCRIPT,
        "team.deployment.chat.yaml",
        "team.job.chat.yaml",
    }, "one file per workload to change, none for the one to keep nor the ones Kubernetes names"
    for name, text in files.items():
        if name != SCRIPT:
            assert text.startswith(MARK + "\n")
            assert all(line.startswith("#") for line in text.split("\nspec:")[0].splitlines())
    body = yaml.safe_load(files["team.deployment.chat.yaml"])
    document = report_document(report)
    chat = next(
        w for w in document["workloads"] if w["workload"] == "chat" and w["kind"] == "Deployment"
    )
    assert chat["patch"]["body"] == body, "the JSON report carries the same patch"
    assert chat["patch"]["command"] == (
        "kubectl --namespace=team patch --type=strategic "
        "--patch-file=team.deployment.chat.yaml -- deployment chat"
    )
    written = tmp_path / "patches"
    (written).mkdir()
    stale = written / "old.deployment.gone.yaml"
    stale.write_text(MARK + "\n# from an earlier run\n")
    keep = written / "mine.yaml"
    keep.write_text("not ours\n")
    assert write_directory(written, files) == len(files)
    assert not stale.exists()
    assert keep.exists()
    script = written / SCRIPT
    assert os.access(script, os.X_OK)
    # apply.sh with a kubectl that records its arguments.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = bin_dir / "kubectl"
    calls = tmp_path / "calls"
    recorder.write_text(
        f'#!/bin/sh\nprintf "%s|" "$@" >> {shlex.quote(str(calls))}\necho >> {shlex.quote(str(calls))}\n'
    )
    recorder.chmod(0o755)
    result = subprocess.run(
        ["/bin/sh", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    recorded = calls.read_text().splitlines()
    assert recorded == [
        (
            "--namespace=team|patch|--type=strategic|--patch-file=team.deployment.chat.yaml|--|"
            "deployment|chat|"
        )
    ], "the Job's command is commented out (its template cannot change); no forged name runs"
    assert not (tmp_path / "pwned").exists()
    assert "# kubectl patch --local --filename=MANIFEST.yaml" in script.read_text()
    text = script.read_text()
    assert "line break" in text, "a newline in a label stays in its comment"
    assert "# Note: skipped: Deployment name 'line break' is not a Kubernetes name" in text
    assert "# Note: skipped: namespace 'ns;rm -rf' is not a Kubernetes namespace name" in text


def test_a_report_with_nothing_to_change_says_so() -> None:
    report = _report_of(workload(device(busy=0.97, memory_gib=70, container="main"), name="llm"))
    assert patch_files(report)[SCRIPT].endswith("# Nothing to change: every workload is kept.\n")


def test_a_fifo_in_the_output_directory_does_not_block_the_job(tmp_path: Path) -> None:
    """Only regular files are read to tell a stale patch: a FIFO named like one stays, unread."""
    written = tmp_path / "patches"
    written.mkdir()
    fifo = written / "old.deployment.gone.yaml"
    os.mkfifo(fifo)
    os.mkfifo(written / SCRIPT)
    elsewhere = tmp_path / "elsewhere.yaml"
    (written / "team.deployment.chat.yaml").symlink_to(elsewhere)
    files = patch_files(_report_of(small()))
    assert write_directory(written, files) == len(files)
    assert fifo.exists()
    assert (written / SCRIPT).read_text() == files[SCRIPT], "the FIFO replaced, not written to"
    assert not elsewhere.exists(), "the symlink replaced, not followed"
    assert sorted(path.name for path in written.iterdir()) == sorted([*files, fifo.name])


def test_fewer_gpus_sets_the_gpu_limit_to_the_recommended_count(tmp_path: Path) -> None:
    history = workload(
        device(uuid="GPU-0", busy=0.7, memory_gib=60, container="main"),
        device(uuid="GPU-1", busy=0.0, in_use_ratio=0.0, memory_gib=0, container="main"),
        name="train",
        kind="Job",
    )
    recommendation = run(history, hardware(), StrategySettings())
    patch = build_patch(history, recommendation, WHOLE)
    assert patch is not None
    assert patch.body is not None
    assert patch.changes == ("nvidia.com/gpu: 2 -> 1",)
    assert "torchrun" in patch.note
    after = kubectl_patch(tmp_path, manifest("Job", "train", pod_spec(count=2)), patch.body)
    main = containers(after)["main"]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert main["resources"]["requests"]["nvidia.com/gpu"] == 1
    # The report: half the cost, the count per replica in the JSON.
    report = build_report(
        History(END, WINDOW, 300.0, 0.95, (history,)),
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="test",
    )
    (row,) = report_document(report)["workloads"]
    assert (row["action"], row["gpus_per_replica"], row["recommended_gpus"]) == ("fewer GPUs", 2, 1)
    assert row["recommended"] == "H100 SXM x1"
    assert row["cost_recommended_usd_per_month"] == pytest.approx(
        row["cost_current_usd_per_month"] / 2, abs=0.01
    )
    assert report.consolidation.gpus_after == 1
    assert "ask for fewer GPUs per replica for 1 workload" in report.business_case
