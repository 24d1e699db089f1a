"""Names from Prometheus labels are checked against Kubernetes' rules before they reach a patch,
a command, a file name or a comment: a forged workload (`--server=http://attacker:8080`, through
a PodMonitor with `honorLabels` or remote write) gets no patch and no command, with one warning
naming it; the kubectl lines read no value as an option (the real kubectl runs one against a
stand-in API server); comments carry no control or bidirectional-override character."""

from __future__ import annotations

import json
import logging
import subprocess
import unicodedata
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from aiohttp import web

from exporter.rightsize.formatters import report_document
from exporter.rightsize.formatters.patches import SCRIPT, patch_files
from exporter.rightsize.history import History
from exporter.rightsize.names import comment_text, name_problem
from exporter.rightsize.report import Report, build_report
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.strategy import STRATEGIES
from tests.helpers import require_tool
from tests.rightsize_data import END, WINDOW, device, hardware, workload
from tests.rightsize_run import serving

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.rightsize.history import WorkloadHistory

pytestmark = pytest.mark.timeout(120)

FORGED = "--server=http://attacker:8080"


def idle(**names: str) -> WorkloadHistory:
    """An idle GPU holder (its change: release the GPU) with these names."""
    held = workload(device(busy=0.0, in_use_ratio=0.0, memory_gib=0.0, container="main"))
    return replace(held, **names)


def report_of(*workloads: WorkloadHistory) -> Report:
    history = History(
        end=END, window_seconds=WINDOW, step_seconds=300.0, quantile=0.95, workloads=workloads
    )
    return build_report(
        history,
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="http://prometheus:9090",
    )


@pytest.mark.parametrize(
    ("kind", "longest"),
    [("Deployment", 253), ("StatefulSet", 253), ("Pod", 253), ("Job", 63), ("CronJob", 52)],
)
def test_each_kind_has_the_name_limit_kubernetes_applies(kind: str, longest: int) -> None:
    name = (("a" * 62 + ".") * 5)[: longest - 1] + "b"  # labels of at most 63
    assert name_problem(cluster="", namespace="team", kind=kind, name=name) is None
    too_long = name_problem(cluster="", namespace="team", kind=kind, name="a" + name)
    assert too_long is not None
    assert f"at most {longest}" in too_long


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        ({"namespace": "a" * 64}, "namespace 'aaaa"),
        ({"namespace": "Team"}, "namespace 'Team' is not a Kubernetes namespace name"),
        ({"name": FORGED}, f"Deployment name '{FORGED}' is not a Kubernetes name"),
        ({"name": "chat\u202eexe.sh"}, "Deployment name 'chat exe.sh' is not"),
        ({"kind": "--kubeconfig=x"}, "kind '--kubeconfig=x' is not a Kubernetes kind"),
        ({"cluster": "--insecure-skip-tls-verify"}, "cluster '--insecure-skip-tls-verify' is not"),
        ({"cluster": "prod east"}, "cluster 'prod east' is not"),
    ],
)
def test_a_name_kubernetes_would_refuse_is_named_quoted_and_cut(
    names: dict[str, str], problem: str
) -> None:
    given = {"cluster": "", "namespace": "team", "kind": "Deployment", "name": "chat", **names}
    found = name_problem(**given)
    assert found is not None
    assert found.startswith(problem)
    assert len(found) < 200
    assert found.isprintable()


def test_a_kubeconfig_context_with_colons_and_slashes_is_a_cluster() -> None:
    eks = "arn:aws:eks:us-east-1:123456789012:cluster/prod"
    assert name_problem(cluster=eks, namespace="team", kind="Deployment", name="chat") is None


def test_containers_and_resources_are_checked_too() -> None:
    base = {"cluster": "", "namespace": "team", "kind": "Deployment", "name": "chat"}
    assert name_problem(**base, containers=["main"], resources=["nvidia.com/mig-1g.10gb"]) is None
    assert "container '--x'" in (name_problem(**base, containers=["--x"]) or "")
    assert "resource 'a b'" in (name_problem(**base, resources=["a b"]) or "")


def test_a_forged_workload_gets_no_patch_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    forged = idle(namespace="serving", name=FORGED)
    second_configuration = replace(forged, model="NVIDIA L4")  # one owner, two rows
    caplog.set_level(logging.WARNING, "exporter.rightsize.report")
    report = report_of(idle(namespace="serving", name="chat"), forged, second_configuration)
    (warning,) = [r for r in caplog.records if "not a Kubernetes name" in r.getMessage()]
    assert warning.__dict__["problem"].startswith(f"Deployment name '{FORGED}' is not")
    files = patch_files(report)
    assert set(files) == {SCRIPT, "serving.deployment.chat.yaml"}
    script = files[SCRIPT]
    commands = [line for line in script.splitlines() if line.startswith("kubectl")]
    assert commands == [
        (
            "kubectl --namespace=serving patch --type=strategic "
            "--patch-file=serving.deployment.chat.yaml -- deployment chat"
        )
    ]
    assert "# Note: skipped: Deployment name '--server=http://attacker:8080' is not" in script
    (patch,) = [
        w["patch"]
        for w in report_document(report)["workloads"]
        if w["workload"] == FORGED and w["patch"]
    ]
    assert patch["body"] is None
    assert patch["command"] is None
    assert patch["note"].startswith("skipped: Deployment name")


def test_comments_carry_no_control_or_bidirectional_character() -> None:
    hidden = "\u202e\u2066\u200b\x1b[31m\u2028\r"
    assert comment_text(f"a{hidden}b") == "a [31m b"
    # Valid names; the hostile text rides in what a comment quotes (the autoscaler's name).
    report = report_of(idle(namespace="serving", name="chat"))
    row = report.rows[0]
    reason = f"{row.recommendation.reason} {hidden}; rm -rf / {hidden}"
    report = replace(
        report, rows=(replace(row, recommendation=replace(row.recommendation, reason=reason)),)
    )
    for name, text in patch_files(report).items():
        for line in text.splitlines():
            assert all(
                unicodedata.category(char) not in {"Cc", "Cf", "Zl", "Zp"} for char in line
            ), (name, line)


def test_the_real_kubectl_reads_the_generated_line_as_meant(tmp_path: Path) -> None:
    """kubectl, pointed at a stand-in API server, patches the object the line names, in its
    namespace and context, and sends nothing anywhere else."""
    requests: list[tuple[str, str]] = []

    async def api(request: web.Request) -> web.Response:
        requests.append((request.method, request.path))
        path = request.path
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            version = {"groupVersion": "apps/v1", "version": "v1"}
            group = {"name": "apps", "versions": [version], "preferredVersion": version}
            return web.json_response({"kind": "APIGroupList", "groups": [group]})
        if path in {"/api/v1", "/apis/apps/v1"}:
            deployments = {
                "name": "deployments",
                "singularName": "deployment",
                "namespaced": True,
                "kind": "Deployment",
                "verbs": ["get", "patch"],
            }
            resources = [deployments] if path == "/apis/apps/v1" else []
            group_version = path.removeprefix("/apis/").removeprefix("/api/")
            return web.json_response(
                {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources}
            )
        if path == "/apis/apps/v1/namespaces/serving/deployments/chat":
            metadata = {"name": "chat", "namespace": "serving"}
            return web.json_response(
                {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata}
            )
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    report = report_of(idle(namespace="serving", name="chat", cluster="prod"))
    files = patch_files(report)
    (line,) = [line for line in files[SCRIPT].splitlines() if line.startswith("kubectl")]
    assert line == (
        "kubectl --context=prod --namespace=serving patch --type=strategic "
        "--patch-file=prod.serving.deployment.chat.yaml -- deployment chat"
    )
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with serving(api) as url:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "prod", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "elsewhere",
        }
        (tmp_path / "kubeconfig").write_text(json.dumps(config))
        result = subprocess.run(
            [require_tool("kubectl"), f"--kubeconfig={tmp_path / 'kubeconfig'}", *line.split()[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert ("PATCH", "/apis/apps/v1/namespaces/serving/deployments/chat") in requests
    assert {path for _, path in requests} <= {
        "/version",
        "/api",
        "/apis",
        "/api/v1",
        "/apis/apps/v1",
        "/apis/apps/v1/namespaces/serving/deployments/chat",
    }


def test_each_label_of_a_subdomain_name_is_at_most_63_characters() -> None:
    """As Kubernetes checks it: the name as a whole may reach 253, no label past 63."""
    names = {"x" * 63 + ".y": None, "x" * 64 + ".y": "x" * 64, "y." + "x" * 64: "x" * 64}
    for name, too_long in names.items():
        problem = name_problem(cluster="", namespace="ns", kind="Deployment", name=name)
        if too_long is None:
            assert problem is None
        else:
            assert problem is not None
            assert problem.startswith("Deployment name ")
