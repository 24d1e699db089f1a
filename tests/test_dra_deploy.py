"""The chart's DRA switch, rendered by a real Helm: the ClusterRole's rules on resource.k8s.io
and the daemon's --kubernetes.dra-drivers follow `dra.enabled` and `dra.drivers`; the plain
manifests carry the default. (Schema validation and the security scan of the default render,
which has DRA on, are tests/test_helm.py's.)"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from exporter.config import load
from tests.helpers import ROOT, require_tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CHART = ROOT / "helm" / "gpuscope"
DRA_RULES = [
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims", "deviceclasses"],
        "verbs": ["get"],
    },
]
PODS_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
QUEUES_RULE = {
    "apiGroups": ["kueue.x-k8s.io"],
    "resources": ["localqueues"],
    "verbs": ["list", "watch"],
}


def render(*switches: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [require_tool("helm"), "template", "gpuscope", str(CHART), "--namespace", "gpuscope"]
    for switch in switches:
        command += ["--set", switch]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=check)


def documents(*switches: str) -> list[dict[str, Any]]:
    return [item for item in yaml.safe_load_all(render(*switches).stdout) if item]


def role_and_args(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    (role,) = [item for item in items if item["kind"] == "ClusterRole"]
    (daemonset,) = [item for item in items if item["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return role["rules"], container["args"]


def test_dra_is_on_by_default_with_the_rules_it_needs() -> None:
    rules, args = role_and_args(documents())
    assert rules == [PODS_RULE, QUEUES_RULE, *DRA_RULES]
    assert "--kubernetes.dra-drivers=gpu.nvidia.com" in args


def test_dra_off_drops_its_rules_and_tells_the_daemon() -> None:
    rules, args = role_and_args(documents("dra.enabled=false"))
    assert rules == [PODS_RULE, QUEUES_RULE]
    assert "--kubernetes.dra-drivers=" in args
    # the daemon reads an empty list as DRA off
    (flag,) = [arg for arg in args if arg.startswith("--kubernetes.dra-drivers")]
    assert load({"dra_drivers": flag.split("=", 1)[1]}, {}).dra_drivers == ()


def test_several_drivers_are_passed_as_one_list() -> None:
    _, args = role_and_args(documents("dra.drivers={gpu.nvidia.com,gpu.example.com}"))
    assert "--kubernetes.dra-drivers=gpu.nvidia.com,gpu.example.com" in args


@pytest.mark.parametrize(
    ("switch", "problem"),
    [
        ("dra.drivers={Not_A_Driver}", "/dra/drivers/0"),
        ("dra.enabled=maybe", "/dra/enabled"),
        ("dra.drivers={}", "/dra/drivers"),
    ],
)
def test_the_schema_refuses_bad_dra_values(switch: str, problem: str) -> None:
    result = render(switch, check=False)
    assert result.returncode != 0
    assert problem in result.stderr


def test_the_plain_manifests_carry_the_dra_rules() -> None:
    items = [
        item
        for path in sorted((ROOT / "deploy" / "kubernetes" / "base").glob("*.yaml"))
        for item in yaml.safe_load_all(path.read_text())
        if item
    ]
    (role,) = [item for item in items if item.get("kind") == "ClusterRole"]
    assert role["rules"] == [PODS_RULE, QUEUES_RULE, *DRA_RULES]
