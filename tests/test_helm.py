"""The Helm chart and the plain manifests, rendered by a real Helm and checked offline.

helm and kubectl are real binaries (scripts/install-helm); objects are validated against the
Kubernetes OpenAPI schemas of several versions (kubernetes-validate --strict), scanned for
security policy (checkov), and held equal to the files they are built from.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.dcgm_counters import read_counters
from tests.helpers import ROOT, require_tool

pytestmark = pytest.mark.slow
CHART = ROOT / "helm" / "gpuscope"
KUBERNETES_VERSIONS = ("1.29.0", "1.31.0", "1.33.0", "1.35.0")
DCGM_COUNTERS = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %)."
DCGM_COUNTERS_SET = DCGM_COUNTERS.replace(",", "\\,")
"""A counters file as `--set` takes it (commas escaped)."""
EVERY_FEATURE = (
    "serviceMonitor.enabled=true",
    "podMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "dashboards.enabled=true",
    "networkPolicy.enabled=true",
    "webConfig.enabled=true",
    "webConfig.existingSecret=gpuscope-web-config",
    "calibration.enabled=true",
    "calibration.gpuProducts={NVIDIA-H100-80GB-HBM3,NVIDIA-L4}",
    "rightsize.enabled=true",
    "rightsize.prometheusUrl=http://prometheus-operated.monitoring.svc:9090",
    "daemon.exportedPodLabels=^(team|app)$",
    "daemon.exportedImages=^(vllm|nvcr.io)/.*$",
    "daemon.extraResourceNames={example.com/gpu}",
    "daemon.priorityClassName=system-node-critical",
    "compat.dcgm=true",
    "compat.dcgmExportedLabels=true",
    f"compat.dcgmCounters={DCGM_COUNTERS_SET}",
)
RIGHTSIZE_SERVER = (
    "rightsize.enabled=true",
    "rightsize.mode=server",
    "rightsize.prometheusUrl=http://prometheus-operated.monitoring.svc:9090",
    "rightsize.notifySecret=gpuscope-rightsize-webhooks",
    "serviceMonitor.enabled=true",
    "networkPolicy.enabled=true",
    "webConfig.enabled=true",
    "webConfig.existingSecret=gpuscope-web-config",
)
VARIANTS = {"default": (), "every-feature": EVERY_FEATURE, "rightsize-server": RIGHTSIZE_SERVER}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("helm"), *args], capture_output=True, text=True, timeout=120, check=check
    )


@cache
def render_text(switches: tuple[str, ...]) -> str:
    command = ["template", "gpuscope", str(CHART), "--namespace", "gpuscope"]
    for switch in switches:
        command += ["--set", switch]
    return helm(*command).stdout


def render(switches: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(render_text(switches)) if document]


def find(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [document for document in documents if document["kind"] == kind]


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / f"{request.param}.yaml"
    path.write_text(render_text(VARIANTS[request.param]))
    return path


def test_helm_lint_strict() -> None:
    for switches in VARIANTS.values():
        arguments = [argument for switch in switches for argument in ("--set", switch)]
        result = helm("lint", "--strict", str(CHART), *arguments, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_objects_match_the_kubernetes_schemas(rendered: Path, version: str) -> None:
    validate = require_tool("kubernetes-validate")
    result = subprocess.run(
        [validate, "--strict", "--quiet", "-k", version, str(rendered)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Only the Prometheus Operator's custom resources may lack a schema.
    unknown = re.findall(r"Couldn't find schema for kind (\w+)", result.stdout + result.stderr)
    assert set(unknown) <= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def security_scan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """checkov's failed and skipped checks for every variant's render, by file name: one run
    over all of them (its start is most of its time)."""
    directory = tmp_path_factory.mktemp("scan")
    for name, switches in VARIANTS.items():
        (directory / f"{name}.yaml").write_text(render_text(switches))
    result = subprocess.run(
        [
            require_tool("checkov"),
            "--framework",
            "kubernetes",
            *(f"--file={directory / f'{name}.yaml'}" for name in VARIANTS),
            "--compact",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"BC_SKIP_MAPPING": "TRUE", "PATH": "/usr/bin:/bin", "HOME": str(directory)},
    )
    results = json.loads(result.stdout)["results"]
    found: dict[str, list[dict[str, Any]]] = {}
    for outcome in ("failed_checks", "skipped_checks"):
        for check in results.get(outcome, []):
            name = Path(check["file_path"]).stem
            found.setdefault(f"{name}:{outcome}", []).append(check)
    return found


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_security_scan_finds_nothing_unexplained(
    security_scan: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    failed = [
        (check["check_id"], check["resource"])
        for check in security_scan.get(f"{variant}:failed_checks", [])
    ]
    assert not failed, failed
    skipped = security_scan.get(f"{variant}:skipped_checks", [])
    assert skipped, "the chart's documented exceptions are in effect"
    assert all(check["check_result"].get("suppress_comment") for check in skipped), (
        "every skip has a reason"
    )


@pytest.mark.parametrize(
    ("switch", "problem"),
    [
        ("daemon.collectInterval=5x", "/daemon/collectInterval"),
        ("daemon.logLevel=verbose", "/daemon/logLevel"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("daemon.colectInterval=5s", "additional properties 'colectInterval' not allowed"),
        ("service.port=70000", "/service/port"),
        ("calibration.gpuProducts={NVIDIA L4}", "/calibration/gpuProducts/0"),
        ("rightsize.prometheusUrl=prometheus:9090", "/rightsize/prometheusUrl"),
        ("rightsize.mode=daily", "/rightsize/mode"),
        ("rightsize.server.port=0", "/rightsize/server/port"),
        ("daemon.extraArgs={verbose}", "/daemon/extraArgs/0"),
        ("compat.dcgm=yes", "/compat/dcgm"),
        ("compat.dcgmVersion=5.0", "/compat/dcgmVersion"),
        ("compat.dcgmExprtedLabels=true", "additional properties 'dcgmExprtedLabels' not allowed"),
    ],
)
def test_schema_rejects_bad_values_naming_them(switch: str, problem: str) -> None:
    result = helm("template", "gpuscope", str(CHART), "--set", switch, check=False)
    assert result.returncode != 0
    assert problem in result.stderr


def test_required_values_say_what_is_missing() -> None:
    result = helm(
        "template", "gpuscope", str(CHART), "--set", "rightsize.enabled=true", check=False
    )
    assert result.returncode != 0
    assert "rightsize.prometheusUrl is required" in result.stderr
    result = helm(
        "template", "gpuscope", str(CHART), "--set", "webConfig.enabled=true", check=False
    )
    assert "webConfig.existingSecret is required" in result.stderr


def test_every_value_is_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            for key, item in value.items():
                assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                walk(item, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


def daemon_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = find(documents, "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def serve_flags() -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(re.findall(r"(--[a-z][a-z0-9.-]+)", result.stdout))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_daemonset_passes_only_flags_gpuscope_serve_has(variant: str) -> None:
    container = daemon_container(render(VARIANTS[variant]))
    passed = {argument.split("=", 1)[0] for argument in container["args"]}
    assert passed <= serve_flags(), passed - serve_flags()
    if variant == "every-feature":
        assert "--kubernetes.image-pattern=^(vllm|nvcr.io)/.*$" in container["args"]


def test_daemonset_defaults() -> None:
    documents = render()
    (daemonset,) = find(documents, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = daemon_container(documents)
    affinity = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert (
        affinity["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["hostPID"] is False
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "--path.procfs=/host/proc" in container["args"]
    assert "--kubernetes.node-name=$(NODE_NAME)" in container["args"]
    env = {item["name"]: item for item in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in str(container["resources"]), "the daemon requests no GPU"
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] is True
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    (role,) = find(documents, "ClusterRole")
    assert role["rules"][0] == {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch"],
    }
    assert role["rules"][1] == {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["localqueues"],
        "verbs": ["list", "watch"],
    }, "Kueue's LocalQueues name a pod's ClusterQueue (showback per queue)"
    assert {group for rule in role["rules"] for group in rule["apiGroups"]} == {
        "",
        "kueue.x-k8s.io",
        "resource.k8s.io",
    }, "pods, Kueue's LocalQueues, and DRA's objects (tests/test_dra_deploy.py)"


def test_node_condition_and_events_add_their_rbac_and_flags_only_when_enabled() -> None:
    def rules_and_args(*switches: str) -> tuple[list[dict[str, Any]], list[str]]:
        documents = render(switches)
        (role,) = find(documents, "ClusterRole")
        return role["rules"], daemon_container(documents)["args"]

    rules, args = rules_and_args()
    assert not [r for r in rules if "nodes/status" in r["resources"] or "events" in r["resources"]]
    assert not [
        a for a in args if a.startswith(("--kubernetes.node-condition", "--kubernetes.events"))
    ]
    rules, args = rules_and_args("nodeCondition.enabled=true", "nodeCondition.recovery=10m")
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]} in rules
    assert not [r for r in rules if "events" in r["resources"]]
    assert args[-2:] == ["--kubernetes.node-condition", "--kubernetes.node-condition.recovery=10m"]
    rules, args = rules_and_args("events.enabled=true", "events.idleAfter=30m")
    assert {
        "apiGroups": ["events.k8s.io"],
        "resources": ["events"],
        "verbs": ["create", "patch"],
    } in rules
    assert not [r for r in rules if "nodes/status" in r["resources"]]
    assert args[-2:] == ["--kubernetes.events", "--kubernetes.events.idle-after=30m"]


def test_the_trace_endpoint_is_switched_on_by_its_value_only() -> None:
    assert "--web.enable-trace" not in daemon_container(render(()))["args"]
    assert "--web.enable-trace" in daemon_container(render(("trace.enabled=true",)))["args"]


def test_without_pod_resources_the_daemon_runs_as_non_root() -> None:
    documents = render(("daemon.podResources.enabled=false",))
    (daemonset,) = find(documents, "DaemonSet")
    context = daemonset["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 65532
    container = daemon_container(documents)
    assert not any("pod-resources" in argument for argument in container["args"])
    assert "/var/lib/kubelet/pod-resources" not in {
        m["mountPath"] for m in container["volumeMounts"]
    }


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_web_config_secret_sets_the_flag_probes_and_monitors(scheme: str) -> None:
    documents = render(
        (
            "webConfig.enabled=true",
            "webConfig.existingSecret=gpuscope-web-config",
            f"webConfig.scheme={scheme}",
            "serviceMonitor.enabled=true",
        )
    )
    container = daemon_container(documents)
    assert "--web.config.file=/etc/gpuscope/web/web-config.yml" in container["args"]
    assert {"name": "web-config", "mountPath": "/etc/gpuscope/web", "readOnly": True} in container[
        "volumeMounts"
    ]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == scheme.upper()
    (daemonset,) = find(documents, "DaemonSet")
    volumes = daemonset["spec"]["template"]["spec"]["volumes"]
    assert {"name": "web-config", "secret": {"secretName": "gpuscope-web-config"}} in volumes
    (monitor,) = find(documents, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["scheme"] == scheme


def test_service_and_monitors_select_only_the_daemon() -> None:
    documents = render(EVERY_FEATURE)
    (daemonset,) = find(documents, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    (service,) = find(documents, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (monitor,) = find(documents, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    relabel = monitor["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel == {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    }
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    for job in find(documents, "Job"):
        job_labels = job["spec"]["template"]["metadata"]["labels"]
        assert not service["spec"]["selector"].items() <= job_labels.items(), (
            "jobs are no endpoints"
        )


def test_prometheus_rule_is_the_rule_file() -> None:
    (rule,) = find(render(EVERY_FEATURE), "PrometheusRule")
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml").read_text())
    assert rule["spec"] == source


def test_dashboard_configmaps_are_the_dashboard_files() -> None:
    configmaps = [
        c for c in find(render(EVERY_FEATURE), "ConfigMap") if "dashboard" in c["metadata"]["name"]
    ]
    files = {path.name: path.read_text() for path in (ROOT / "dashboards").glob("*.json")}
    found = {key: value for configmap in configmaps for key, value in configmap["data"].items()}
    assert found == files
    assert all(c["metadata"]["labels"]["grafana_dashboard"] == "1" for c in configmaps)


def test_calibration_jobs_are_the_deploy_job_per_product() -> None:
    documents = render(EVERY_FEATURE)
    jobs = find(documents, "Job")
    source = yaml.safe_load((ROOT / "deploy" / "calibration" / "job.yaml").read_text())
    assert sorted(
        j["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for j in jobs
    ) == [
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-L4",
    ]
    (configmap,) = [
        c for c in find(documents, "ConfigMap") if c["metadata"]["name"].endswith("-calibration")
    ]
    (daemonset,) = find(documents, "DaemonSet")
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["calibration"]["configMap"]["name"] == configmap["metadata"]["name"]
    for job in jobs:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        (original,) = source["spec"]["template"]["spec"]["containers"]
        assert container["command"] == original["command"]
        assert container["securityContext"] == original["securityContext"]
        assert f"--configmap=gpuscope/{configmap['metadata']['name']}" in container["args"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    (role,) = [r for r in find(documents, "Role") if r["metadata"]["name"].endswith("-calibrate")]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [configmap["metadata"]["name"]],
            "verbs": ["get", "update"],
        }
    ]


def test_rightsize_cronjob_runs_the_rightsize_command() -> None:
    (cronjob,) = find(render(EVERY_FEATURE), "CronJob")
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["gpuscope", "rightsize"]
    assert "--prometheus=http://prometheus-operated.monitoring.svc:9090" in container["args"]
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "rightsize", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    known = set(re.findall(r"(--[a-z][a-z0-9.-]+)", result.stdout))
    assert {argument.split("=", 1)[0] for argument in container["args"]} <= known


def rightsize_flags(*command: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "rightsize", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(re.findall(r"(--[a-z][a-z0-9.-]+)", result.stdout))


def test_rightsize_server_mode_serves_the_report_behind_the_web_config() -> None:
    documents = render(RIGHTSIZE_SERVER)
    assert not find(documents, "CronJob"), "one mode at a time"
    assert not [r for r in find(documents, "Role") if "rightsize" in r["metadata"]["name"]]
    (deployment,) = find(documents, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["gpuscope", "rightsize", "serve"]
    passed = {argument.split("=", 1)[0] for argument in container["args"]}
    assert passed <= rightsize_flags("serve")
    assert "--web.config.file=/etc/gpuscope/web/web-config.yml" in container["args"]
    assert "--web.listen-address=:9456" in container["args"]
    assert container["env"] == [
        {
            "name": "GPUSCOPE_RIGHTSIZE_NOTIFY",
            "valueFrom": {"secretKeyRef": {"name": "gpuscope-rightsize-webhooks", "key": "notify"}},
        }
    ]
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert pod["automountServiceAccountToken"] is False
    assert pod["volumes"] == [
        {"name": "web-config", "secret": {"secretName": "gpuscope-web-config"}}
    ]
    services = {s["metadata"]["name"]: s for s in find(documents, "Service")}
    service = services["gpuscope-rightsize"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (daemonset,) = find(documents, "DaemonSet")
    daemon_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= daemon_labels.items()
    assert not services["gpuscope"]["spec"]["selector"].items() <= pod_labels.items()
    monitors = {m["metadata"]["name"]: m for m in find(documents, "ServiceMonitor")}
    monitor = monitors["gpuscope-rightsize"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["honorLabels"], endpoint["scheme"]) == (
        "http",
        True,
        "https",
    )
    policies = {n["metadata"]["name"]: n for n in find(documents, "NetworkPolicy")}
    assert policies["gpuscope-rightsize"]["spec"]["ingress"][0]["ports"] == [
        {"port": 9456, "protocol": "TCP"}
    ]
    cronjob = render(("rightsize.enabled=true", "rightsize.prometheusUrl=http://p:9090"))
    assert find(cronjob, "CronJob"), "cronjob is the default mode"
    assert not find(cronjob, "Deployment")


def images(documents: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each workload kind's container images."""
    found: dict[str, set[str]] = {}
    for document in documents:
        spec = document.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if template is not None:
            found.setdefault(document["kind"], set()).update(
                container["image"] for container in template["spec"]["containers"]
            )
    return found


@pytest.mark.parametrize("variant", ["every-feature", "rightsize-server"])
def test_the_daemon_runs_the_daemon_image_and_the_jobs_the_jobs_image(variant: str) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    daemon, jobs = (
        f"ghcr.io/gpuscope/gpuscope:{version}",
        f"ghcr.io/gpuscope/gpuscope-jobs:{version}",
    )
    expected = {"DaemonSet": {daemon}}
    expected.update(
        {"Job": {jobs}, "CronJob": {jobs}} if variant == "every-feature" else {"Deployment": {jobs}}
    )
    assert images(render(VARIANTS[variant])) == expected
    digest = "sha256:" + "0" * 64
    moved = (
        *VARIANTS[variant],
        "jobsImage.repository=registry.example/jobs",
        f"jobsImage.digest={digest}",
        "image.tag=9.9.9",
    )
    moved_images = images(render(moved))
    assert moved_images.pop("DaemonSet") == {"ghcr.io/gpuscope/gpuscope:9.9.9"}
    assert set().union(*moved_images.values()) == {f"registry.example/jobs@{digest}"}


def test_the_plain_jobs_manifests_run_the_jobs_image() -> None:
    plain = [
        document
        for name in ("calibration/job.yaml", "rightsize/cronjob.yaml", "rightsize/server.yaml")
        for document in yaml.safe_load_all((ROOT / "deploy" / name).read_text())
    ]
    assert set().union(*images(plain).values()) == {"ghcr.io/gpuscope/gpuscope-jobs:0.1.0"}


def test_rightsize_server_is_the_plain_manifest() -> None:
    plain = {
        document["kind"]: document
        for document in yaml.safe_load_all(
            (ROOT / "deploy" / "rightsize" / "server.yaml").read_text()
        )
    }
    (deployment,) = find(render(RIGHTSIZE_SERVER), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    original_pod = plain["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (original,) = original_pod["containers"]
    assert pod["securityContext"] == original_pod["securityContext"]
    assert container["command"] == original["command"]
    assert container["securityContext"] == original["securityContext"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == original[probe]["httpGet"]["path"]
        assert container[probe]["periodSeconds"] == original[probe]["periodSeconds"]
    assert plain["Service"]["spec"]["selector"].items() <= (
        plain["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    )


def load_render_script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "render_manifests", ROOT / "scripts" / "render_manifests.py"
    )
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_plain_manifests_are_the_charts_render() -> None:
    require_tool("helm")
    wanted = load_render_script().manifests()
    for path, text in wanted.items():
        assert (ROOT / "deploy" / "kubernetes" / path).read_text() == text, (
            f"run scripts/render_manifests.py ({path})"
        )


@pytest.mark.parametrize("overlay", ["base", "prometheus-operator", "node-health"])
def test_kustomize_builds_and_validates(overlay: str, tmp_path: Path) -> None:
    kubectl = require_tool("kubectl")
    built = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy" / "kubernetes" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    output = tmp_path / "built.yaml"
    output.write_text(built.stdout)
    validate = require_tool("kubernetes-validate")
    for version in KUBERNETES_VERSIONS:
        result = subprocess.run(
            [validate, "--strict", "--quiet", "-k", version, str(output)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_dcgm_compatibility_is_off_by_default() -> None:
    documents = render(("serviceMonitor.enabled=true",))
    assert not any("compat" in argument for argument in daemon_container(documents)["args"])
    assert not [d for d in find(documents, "ConfigMap") if "dcgm" in d["metadata"]["name"]]
    (monitor,) = find(documents, "ServiceMonitor")
    assert "metricRelabelings" not in monitor["spec"]["endpoints"][0]


def test_dcgm_counters_are_a_configmap_the_daemon_reads(tmp_path: Path) -> None:
    documents = render(("compat.dcgm=true", f"compat.dcgmCounters={DCGM_COUNTERS_SET}"))
    container = daemon_container(documents)
    assert "--compat.dcgm" in container["args"]
    assert "--compat.dcgm-counters=/etc/gpuscope/dcgm/counters.csv" in container["args"]
    assert {"name": "dcgm-counters", "mountPath": "/etc/gpuscope/dcgm", "readOnly": True} in (
        container["volumeMounts"]
    )
    (configmap,) = [d for d in find(documents, "ConfigMap") if "dcgm" in d["metadata"]["name"]]
    (daemonset,) = find(documents, "DaemonSet")
    volumes = daemonset["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "dcgm-counters",
        "configMap": {"name": configmap["metadata"]["name"]},
    } in volumes
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/dcgm-counters" in annotations, "a new file rolls the pods"
    written = tmp_path / "counters.csv"
    written.write_text(configmap["data"]["counters.csv"])
    (row,) = read_counters(written).rows
    assert (row.field, row.kind, row.help) == (
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
    )


def test_dcgm_counters_need_compat_dcgm() -> None:
    result = helm(
        "template",
        "gpuscope",
        str(CHART),
        "--set",
        f"compat.dcgmCounters={DCGM_COUNTERS_SET}",
        check=False,
    )
    assert result.returncode != 0
    assert "compat.dcgmCounters chooses what compat.dcgm serves" in result.stderr


def test_dcgm_version_is_passed_when_it_is_not_the_default(tmp_path: Path) -> None:
    assert not any(
        "dcgm-version" in argument
        for argument in daemon_container(render(("compat.dcgm=true",)))["args"]
    ), "4.8 renders as before"
    args = daemon_container(render(("compat.dcgm=true", "compat.dcgmVersion=4.9")))["args"]
    assert "--compat.dcgm-version=4.9" in args
    values = tmp_path / "values.yaml"
    values.write_text("compat:\n  dcgm: true\n  dcgmVersion: 4.9\n")  # a YAML float
    documents = yaml.safe_load_all(
        helm("template", "gpuscope", str(CHART), "-f", str(values)).stdout
    )
    assert "--compat.dcgm-version=4.9" in daemon_container([d for d in documents if d])["args"]
    result = helm(
        "template", "gpuscope", str(CHART), "--set", "compat.dcgmVersion=4.9", check=False
    )
    assert result.returncode != 0
    assert "compat.dcgmVersion chooses what compat.dcgm serves" in result.stderr


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_dcgm_exported_labels_are_copied_by_the_monitors(kind: str) -> None:
    user_rule = {"action": "labeldrop", "regex": "pci_bus_id"}
    switches = (
        "compat.dcgm=true",
        "compat.dcgmExportedLabels=true",
        f"{kind}.enabled=true",
        f"{kind}.metricRelabelings[0].action=labeldrop",
        f"{kind}.metricRelabelings[0].regex=pci_bus_id",
    )
    (monitor,) = find(render(switches), kind[0].upper() + kind[1:])
    endpoints = monitor["spec"]["endpoints" if kind == "serviceMonitor" else "podMetricsEndpoints"]
    rules = endpoints[0]["metricRelabelings"]
    assert rules[:3] == [
        {
            "sourceLabels": ["__name__", label],
            "regex": "DCGM_FI_.+;(.+)",
            "targetLabel": f"exported_{label}",
            "replacement": "$1",
            "action": "replace",
        }
        for label in ("namespace", "pod", "container")
    ]
    assert rules[3:] == [user_rule], "the user's own rules follow"
    (plain,) = find(render((*switches, f"{kind}.honorLabels=false")), monitor["kind"])
    endpoints = plain["spec"]["endpoints" if kind == "serviceMonitor" else "podMetricsEndpoints"]
    assert endpoints[0]["metricRelabelings"] == [user_rule], (
        "without honorLabels Prometheus makes exported_* itself"
    )
