"""The calibration Job, its RBAC and the ConfigMap: valid Kubernetes objects that fit together."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from exporter.calibrate import options
from exporter.cli import build_parser
from tests.helpers import ROOT, require_tool

if TYPE_CHECKING:
    from pathlib import Path

DEPLOY = ROOT / "deploy" / "calibration"
FILES = sorted(DEPLOY.glob("*.yaml"))


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("kubernetes-validate"), "--strict", "-k", "1.30.0", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def objects() -> dict[str, dict[str, Any]]:
    found = {}
    for path in FILES:
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


def test_manifests_pass_strict_schema_validation() -> None:
    assert [path.name for path in FILES] == ["configmap.yaml", "job.yaml", "rbac.yaml"]
    result = validate(*FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_catches_a_misspelt_field(tmp_path: Path) -> None:
    broken = tmp_path / "job.yaml"
    broken.write_text((DEPLOY / "job.yaml").read_text().replace("nodeSelector:", "nodeSelectr:"))
    assert validate(broken).returncode != 0


def test_the_job_runs_on_one_gpu_of_one_product_and_writes_the_configmap() -> None:
    found = objects()
    job, configmap = found["Job"], found["ConfigMap"]
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["serviceAccountName"] == found["ServiceAccount"]["metadata"]["name"]
    args = build_parser().parse_args(container["args"])
    parsed = options.parse(args, {})
    assert parsed.configmap == (configmap["metadata"]["namespace"], configmap["metadata"]["name"])
    assert parsed.device == "cuda"
    assert not parsed.to_stdout
    assert parsed.log_format == "json"
    # the Helm chart appends --quick when calibration.quick is set
    assert options.parse(build_parser().parse_args([*container["args"], "--quick"]), {}).quick


def test_the_role_covers_exactly_the_one_configmap() -> None:
    found = objects()
    name = found["ConfigMap"]["metadata"]["name"]
    (rule,) = found["Role"]["rules"]
    assert rule["resources"] == ["configmaps"]
    assert rule["resourceNames"] == [name]
    assert set(rule["verbs"]) == {"get", "update"}  # what merge_profile does to an existing one
    binding = found["RoleBinding"]
    assert binding["roleRef"]["name"] == found["Role"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == found["ServiceAccount"]["metadata"]["name"]


@pytest.mark.parametrize("product", ["NVIDIA-L4", "NVIDIA-A100-SXM4-80GB", "Tesla-T4"])
def test_the_recipe_in_the_job_makes_a_valid_job_for_another_product(
    tmp_path: Path, product: str
) -> None:
    text = (DEPLOY / "job.yaml").read_text()
    made = text.replace("NVIDIA-H100-80GB-HBM3", product).replace(
        "nvidia-h100-80gb-hbm3", product.lower()
    )
    path = tmp_path / "job.yaml"
    path.write_text(made)
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    job = yaml.safe_load(made)
    assert job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == product
    assert job["metadata"]["name"].endswith(product.lower())
