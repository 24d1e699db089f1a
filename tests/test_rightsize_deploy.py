"""The weekly CronJob and its RBAC, and the report server: valid Kubernetes objects whose
arguments the job (or `gpuscope rightsize serve`) accepts."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from exporter.rightsize.options import DEFAULT_PORT, load, load_serve
from tests.helpers import ROOT, require_tool

pytestmark = pytest.mark.timeout(150)

DEPLOY = ROOT / "deploy" / "rightsize"
OBJECTS = ("rbac.yaml", "cronjob.yaml")
"""The CronJob mode (kubectl apply -k); server.yaml is the server mode, applied alone."""


def test_manifests_are_valid_kubernetes_objects() -> None:
    validate = require_tool(str(ROOT / ".venv" / "bin" / "kubernetes-validate"))
    result = subprocess.run(
        [
            validate,
            "--strict",
            "-k",
            "1.30.0",
            *(str(DEPLOY / name) for name in (*OBJECTS, "server.yaml")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == 7


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


def test_server_arguments_parse_and_its_service_selects_it() -> None:
    documents = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "server.yaml").read_text())}
    pod = documents["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["gpuscope", "rightsize", "serve"]
    config = load_serve(container["args"], {})
    assert config.listen_address.port == DEFAULT_PORT == container["ports"][0]["containerPort"]
    assert config.refresh == 6 * 3600
    assert not config.run.fixed_end, "each refresh reads up to now"
    assert pod["spec"]["automountServiceAccountToken"] is False, "it needs no API access"
    assert pod["spec"]["serviceAccountName"] == documents["ServiceAccount"]["metadata"]["name"]
    service = documents["Service"]["spec"]
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["ports"][0]["targetPort"] == container["ports"][0]["name"]
    cronjob = yaml.safe_load((DEPLOY / "cronjob.yaml").read_text())
    job_labels = cronjob["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert not service["selector"].items() <= job_labels.items()
