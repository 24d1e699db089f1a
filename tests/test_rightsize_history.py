"""Selection parsing, the PromQL each signal sends, and history assembly — on strings and data."""

from __future__ import annotations

import re

import pytest

from exporter.rightsize.history import assemble
from exporter.rightsize.prometheus import Sample
from exporter.rightsize.selection import (
    Requirement,
    Selection,
    SelectionError,
    parse_namespaces,
    parse_selector,
    prometheus_label_name,
)
from exporter.rightsize.signals import SIGNALS, render

pytestmark = pytest.mark.timeout(30)

DAY = 86400.0
DEVICE = {
    "namespace": "ml",
    "workload_kind": "Deployment",
    "workload": "chat",
    "pod": "chat-1",
    "uuid": "GPU-1",
}


def signal(name: str):  # type: ignore[no-untyped-def]
    return next(s for s in SIGNALS if s.name == name)


def test_selector_terms_become_matchers_on_pod_info_labels() -> None:
    requirements = parse_selector(
        "app.kubernetes.io/name=chat, tier in (web, batch),env!=dev,canary,!legacy,team notin (x)"
    )
    assert requirements == (
        Requirement("app.kubernetes.io/name", "=", ("chat",)),
        Requirement("tier", "in", ("web", "batch")),
        Requirement("env", "!=", ("dev",)),
        Requirement("canary", "exists"),
        Requirement("legacy", "!exists"),
        Requirement("team", "notin", ("x",)),
    )
    assert [r.matcher() for r in requirements] == [
        'label_app_kubernetes_io_name="chat"',
        'label_tier=~"web|batch"',
        'label_env!="dev"',
        'label_canary!=""',
        'label_legacy=""',
        'label_team!~"x"',
    ]
    assert prometheus_label_name("a-b.c/d") == "label_a_b_c_d"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("app=", None),  # an empty value is a valid selector value
        ("tier in (a,b", "unbalanced parentheses"),
        ("a=b,,c=d", "empty term"),
        ("a=b c", "is not a label name"),
        ("=x", "is not a label name"),
        ('app="quoted"', "is not a label value"),
    ],
)
def test_bad_selectors_are_refused_with_the_term(text: str, message: str | None) -> None:
    if message is None:
        assert parse_selector(text) == (Requirement("app", "=", ("",)),)
        return
    with pytest.raises(SelectionError, match=message):
        parse_selector(text)


def test_namespaces_repeat_or_comma_separate_and_are_checked() -> None:
    assert parse_namespaces(["a,b", "c", "a"]) == ("a", "b", "c")
    with pytest.raises(SelectionError, match="'Team_A' is not a Kubernetes namespace name"):
        parse_namespaces(["Team_A"])


def test_busy_quantile_query_aggregates_outside_the_subquery() -> None:
    selection = Selection(("ml", "serving"), parse_selector("team=search"))
    promql = render(
        signal("busy_quantile"), selection=selection, window=14 * DAY, step=300, quantile=0.95
    )
    assert promql == (
        "max by (namespace, workload_kind, workload, pod, uuid) (quantile_over_time(0.95, "
        'rate(gpu_pod_busy_seconds_total{namespace=~"ml|serving"}[5m])[14d:5m]))'
        " and on (namespace, pod) group by (namespace, pod) "
        '(last_over_time(gpu_pod_info{namespace=~"ml|serving", label_team="search"}[14d]))'
    )


def test_every_signal_renders_without_leftover_placeholders() -> None:
    for each in SIGNALS:
        promql = render(
            each, selection=Selection(), window=DAY, step=60, quantile=0.9, pods=[("ml", "a")]
        )
        assert not re.search(r"\{[a-z]+\}", promql), each.name
        assert promql.count("(") == promql.count(")"), each.name
        assert promql.count("{") == promql.count("}"), each.name
    cpu = render(
        signal("cpu_usage_quantile"),
        selection=Selection(("ml",)),
        window=DAY,
        step=60,
        quantile=0.9,
        pods=[("ml", "b.1"), ("ml", "a"), ("x", "c")],
    )
    assert (
        'container_cpu_usage_seconds_total{container!="", container!="POD", '
        'namespace=~"ml|x", pod=~"a|b\\\\.1|c"}[1m]'
    ) in cpu
    sharing = render(
        signal("sharers"), selection=Selection(("ml",)), window=14 * DAY, step=300, quantile=0.9
    )
    assert sharing == "avg_over_time((count by (uuid) (gpu_allocation_shared == 1))[14d:1h])"


def test_assemble_builds_devices_pods_and_workloads() -> None:
    window, step = 14 * DAY, 300.0
    steps = window / step + 1  # a subquery range includes both ends
    model = {"model": "NVIDIA H100 80GB HBM3", "resource": "nvidia.com/gpu"}
    mig = {**DEVICE, "pod": "chat-2", "uuid": "MIG-9", "mig_profile": "1g.10gb"}
    bare = {"namespace": "ml", "workload_kind": "", "workload": "", "pod": "debug", "uuid": "GPU-7"}
    reused = {**DEVICE, "pod": "chat-3", "uuid": "GPU-2"}
    later = {**DEVICE, "workload": "other", "pod": "other-1", "uuid": "GPU-2"}
    shared = {**DEVICE, "workload": "tts", "pod": "tts-1", "uuid": "GPU-3"}
    idle = {**DEVICE, "workload": "notebook", "pod": "notebook-0", "uuid": "GPU-4"}
    held = [
        Sample({**DEVICE, **model}, steps),
        Sample({**mig, **model, "resource": "nvidia.com/mig-1g.10gb"}, 100),
        Sample({**bare, **model, "model": "NVIDIA L4"}, 12),
        Sample({**reused, **model}, steps / 2),
        Sample({**later, **model}, steps / 2),
        Sample({**shared, **model}, steps),
        Sample({**idle, **model}, steps),
    ]
    per_uuid = [
        Sample({"uuid": uuid}, value)
        for uuid, value in (("GPU-1", 0.3), ("GPU-2", 0.9), ("GPU-3", 0.8))
    ]
    history = assemble(
        {
            "held": held,
            "present": [Sample(DEVICE, 1e9), Sample(shared, 1e9)],
            "shared": [Sample(shared, 1)],
            "sharers": [Sample({"uuid": "GPU-3"}, 2.4)],
            "in_use": [Sample(DEVICE, 1.0), Sample(idle, 0.0)],
            "busy_steps": [Sample(DEVICE, steps - 10)],
            "busy_seconds": [Sample(DEVICE, 0.25 * window)],
            "busy_quantile": [Sample(DEVICE, 0.4), Sample(mig, 0.1), Sample(shared, 0.2)],
            "memory_peak": [Sample(DEVICE, 5e9)],
            "sm_quantile": per_uuid,
            "sm_seconds": [Sample({"uuid": "GPU-1"}, 0.2 * window)],
            "cpu_usage_quantile": [
                Sample({"namespace": "ml", "pod": "chat-1", "container": "main"}, 3.5)
            ],
            "cpu_limit": [Sample({"namespace": "ml", "pod": "chat-1", "container": "main"}, 4)],
            "calibrated_flops": [Sample({"model": "NVIDIA H100 80GB HBM3", "dtype": "bf16"}, 8e14)],
            "calibrated_bandwidth": [Sample({"model": "NVIDIA H100 80GB HBM3"}, 3e12)],
        },
        end=1e9,
        window=window,
        step=step,
        quantile=0.95,
        missing_signals=("dram_seconds",),
    )
    units = {(w.namespace, w.kind, w.name, w.mig_profile): w for w in history.workloads}
    assert set(units) == {
        ("ml", "Deployment", "chat", None),
        ("ml", "Deployment", "chat", "1g.10gb"),
        ("ml", "Pod", "debug", None),
        ("ml", "Deployment", "other", None),
        ("ml", "Deployment", "tts", None),
        ("ml", "Deployment", "notebook", None),
    }
    chat = units[("ml", "Deployment", "chat", None)]
    devices = {d.uuid: d for d in chat.devices}
    device = devices["GPU-1"]
    assert device.held_seconds == window  # capped: the extra end point is not extra time
    assert device.observed_seconds == (steps - 10) * step
    assert device.present
    assert device.busy_quantile == 0.4
    assert device.busy_mean == 0.25
    assert device.sm_quantile == 0.3
    assert device.sm_mean == 0.2
    assert device.memory_peak_bytes == 5e9
    assert device.dram_mean is None
    assert (device.shared, device.holders) == (False, 1)
    # GPU-2 went from chat to other within the window: its device-wide activity is nobody's.
    assert devices["GPU-2"].sm_quantile is None
    assert not devices["GPU-2"].present
    assert not devices["GPU-2"].shared
    tts = units[("ml", "Deployment", "tts", None)].devices[0]
    assert (tts.shared, tts.holders, tts.sm_quantile) == (True, 2, None)
    notebook = units[("ml", "Deployment", "notebook", None)].devices[0]
    # No process ever ran, so there is no busy counter: 0% busy, and that is full coverage.
    assert (notebook.busy_quantile, notebook.busy_idle_quantile, notebook.busy_mean) == (
        0.0,
        0.0,
        0.0,
    )
    assert notebook.observed_seconds == notebook.held_seconds
    assert chat.pods[0].cpu[0].usage_cores == 3.5
    assert chat.pods[0].cpu[0].limit_cores == 4
    assert units[("ml", "Deployment", "chat", "1g.10gb")].devices[0].busy_quantile == 0.1
    assert units[("ml", "Pod", "debug", None)].pods[0].name == "debug"
    assert history.ceilings.flops == {("NVIDIA H100 80GB HBM3", "bf16"): 8e14}
    assert history.ceilings.memory_bandwidth == {"NVIDIA H100 80GB HBM3": 3e12}
    assert history.missing_signals == ("dram_seconds",)
