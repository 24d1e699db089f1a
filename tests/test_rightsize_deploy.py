"""The weekly CronJob and its RBAC: valid Kubernetes objects whose arguments the job accepts."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from exporter.rightsize.options import load
from tests.helpers import ROOT, require_tool

pytestmark = pytest.mark.timeout(150)

DEPLOY = ROOT / "deploy" / "rightsize"
OBJECTS = ("rbac.yaml", "cronjob.yaml")


def test_manifests_are_valid_kubernetes_objects() -> None:
    validate = require_tool(str(ROOT / ".venv" / "bin" / "kubernetes-validate"))
    result = subprocess.run(
        [validate, "--strict", "-k", "1.30.0", *(str(DEPLOY / name) for name in OBJECTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == 4


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == list(OBJECTS)


def test_cronjob_arguments_parse_and_match_the_rbac() -> None:
    (cronjob,) = yaml.safe_load_all((DEPLOY / "cronjob.yaml").read_text())
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["gpuscope", "rightsize"]
    config = load(container["args"], {})
    assert config.configmap is not None
    assert config.window == 14 * 86400
    rbac = {doc["kind"]: doc for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text())}
    assert pod["serviceAccountName"] == rbac["ServiceAccount"]["metadata"]["name"]
    assert (
        config.configmap.namespace
        == cronjob["metadata"]["namespace"]
        == rbac["Role"]["metadata"]["namespace"]
    )
    named = [rule for rule in rbac["Role"]["rules"] if rule.get("resourceNames")]
    assert named == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [config.configmap.name],
            "verbs": ["get", "update"],
        }
    ]
    subject = rbac["RoleBinding"]["subjects"][0]
    assert (subject["name"], subject["namespace"]) == (
        pod["serviceAccountName"],
        config.configmap.namespace,
    )
