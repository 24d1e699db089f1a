"""A holder's share is what it reserved, as a user runs it: `gpuscope serve --simulate FILE` as a
subprocess on one node (tests/fixtures/fleets/shares.yaml) whose GPUs are handed out in
fractions — four HAMi pods of 25 cores each on GPU 0, a time-sliced pair on GPU 1, a KAI GPU
group on GPU 2 (its reservation pod, a 0.5 pod, a `gpu-memory` pod), two DRA claims sharing
GPU 3's capacity 60Gi/20Gi — with the stand-in API server, a real gRPC kubelet, and a real
Prometheus scraping it and evaluating gpuscope's rules."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from exporter.simulator import load_fleet
from tests.fake_kube.dra import gpu_device, resource_claim, resource_slice, serve_dra
from tests.fake_kube.pods import NODE, pod, serve_pods
from tests.fake_kube.server import FakeKube
from tests.fake_kubelet import ClaimDevice, FakeKubelet, claim_allocations, gpu_allocations
from tests.helpers import FLEETS, ROOT, eventually, running_daemon, series, value
from tests.proc_fixture import container_id, pod_uid
from tests.prometheus_server import running_prometheus

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FLEET = FLEETS / "shares.yaml"
UUIDS = [gpu.uuid for gpu in load_fleet(FLEET).gpus]
GPU = "nvidia.com/gpu"
GROUP = {"runai-gpu-group": "0b5e6a1c-group"}
RESERVATION = "gpu-reservation-node-1-x8f2k"
RULES = ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml"
SCRAPE_SECONDS = 1.0


def _hami(number: int) -> dict[str, Any]:
    return pod(
        f"hami-{number}",
        pod_uid(100 + number),
        namespace="hami",
        containers={"main": container_id(100 + number)},
        annotations={"hami.io/vgpu-devices-allocated": f"{UUIDS[0]},NVIDIA,20000,25:;"},
    )


PODS = (
    *(_hami(n) for n in range(4)),
    *(
        pod(name, pod_uid(110 + n), namespace="chat", containers={"server": container_id(110 + n)})
        for n, name in enumerate(("chat-a", "chat-b"))
    ),
    pod(
        RESERVATION,
        pod_uid(120),
        namespace="kai-resource-reservation",
        containers={"reserve": container_id(120)},
        labels={"app": "kai-resource-reservation", **GROUP},
        annotations={"run.ai/reserve_for_gpu_index": UUIDS[2]},
    ),
    pod(
        "kai-half",
        pod_uid(121),
        namespace="research",
        containers={"main": container_id(121)},
        labels=GROUP,
        annotations={"gpu-fraction": "0.5"},
    ),
    pod(
        "kai-memory",
        pod_uid(122),
        namespace="research",
        containers={"sidecar": container_id(123), "main": container_id(122)},
        labels=GROUP,
        annotations={"gpu-memory": "20480", "gpu-fraction-container-name": "main"},
    ),
    *(
        pod(name, pod_uid(130 + n), namespace="llm", containers={"server": container_id(130 + n)})
        for n, name in enumerate(("llm-big", "llm-small"))
    ),
)
PLUGIN = gpu_allocations(
    [
        *(("hami", f"hami-{n}", "main", GPU, [f"{UUIDS[0]}-{n}"]) for n in range(4)),
        ("chat", "chat-a", "server", GPU, [f"{UUIDS[1]}::0"]),
        ("chat", "chat-b", "server", GPU, [f"{UUIDS[1]}::1"]),
        ("kai-resource-reservation", RESERVATION, "reserve", GPU, [UUIDS[2]]),
    ]
)
CLAIMS = claim_allocations(
    [
        ("llm", "llm-big", "server", "big-gpu", [ClaimDevice("gpu-3", NODE, share_id="share-big")]),
        (
            "llm",
            "llm-small",
            "server",
            "small-gpu",
            [ClaimDevice("gpu-3", NODE, share_id="share-small")],
        ),
    ]
)


def _claim(name: str, holder: tuple[str, str], share: str, memory: str) -> dict[str, Any]:
    return resource_claim(
        name, "llm", ["gpu-3"], reserved_for=[holder], share_ids=[share], consumed_memory=[memory]
    )


DRA_OBJECTS = (
    ("resourceslices", resource_slice(f"{NODE}-gpu.nvidia.com", [gpu_device("gpu-3", UUIDS[3])])),
    ("resourceclaims", _claim("big-gpu", ("llm-big", pod_uid(130)), "share-big", "60Gi")),
    ("resourceclaims", _claim("small-gpu", ("llm-small", pod_uid(131)), "share-small", "20Gi")),
)


def _procfs(root: Path) -> Path:
    """The KAI half pod's process in its container."""
    directory = root / "3101"
    directory.mkdir(parents=True)
    uid = pod_uid(121).replace("-", "_")
    (directory / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
        f"cri-containerd-{container_id(121)}.scope\n"
    )
    return root


class Node:
    def __init__(self, text: str, prometheus: str) -> None:
        self.text = text
        self.prometheus = prometheus

    def query(self, expr: str) -> dict[tuple[str, ...], float]:
        """Values of an instant query, by (namespace, pod) or (uuid,) where the labels have them."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        found: dict[tuple[str, ...], float] = {}
        for item in answer["data"]["result"]:
            labels = item["metric"]
            key = (labels["namespace"], labels["pod"]) if "pod" in labels else (labels["uuid"],)
            found[key] = float(item["value"][1])
        return found


def _everything_held(text: str) -> bool:
    return len(series(text, "gpu_allocation_share_ratio")) == 10 and bool(
        series(text, "gpu_allocation_share_ratio", pod="llm-big", resource=GPU)
    )


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("shares")
    with (
        serve_dra(serve_pods(FakeKube(), *PODS), *DRA_OBJECTS) as api,
        FakeKubelet(root / "kubelet.sock") as kubelet,
    ):
        kubelet.set(PLUGIN, CLAIMS)
        with running_daemon(
            f"--simulate={FLEET}",
            f"--path.procfs={_procfs(root / 'proc')}",
            f"--kubeconfig={api.write_kubeconfig(root / 'kubeconfig')}",
            f"--kubernetes.node-name={NODE}",
            f"--kubelet.pod-resources-socket={kubelet.socket}",
            "--collect.interval=500ms",
        ) as daemon:
            daemon.wait_ready()
            text = daemon.metrics_until(_everything_held, 60, "every holder's share")
            with running_prometheus(
                root / "prometheus",
                scrape=(f"127.0.0.1:{daemon.port}", SCRAPE_SECONDS),
                rules=RULES,
            ) as url:
                found = Node(text, url)
                eventually(
                    lambda: (
                        len(found.query("allocation:gpu_allocation:share")) == 10
                        and len(found.query("avg_over_time(allocation:gpu_allocation:share[10s])"))
                        == 10
                    ),
                    60,
                    "ten seconds of recorded shares",
                )
                yield found


def shares(node: Node) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["namespace"], dict(labels)["pod"]): found
        for labels, found in series(node.text, "gpu_allocation_share_ratio").items()
    }


def test_each_holder_holds_what_it_reserved(node: Node) -> None:
    total = value(node.text, "gpu_memory_total_bytes", uuid=UUIDS[2])
    assert shares(node) == pytest.approx(
        {
            **{("hami", f"hami-{n}"): 0.25 for n in range(4)},
            ("chat", "chat-a"): 0.5,
            ("chat", "chat-b"): 0.5,
            ("research", "kai-half"): 0.5,
            ("research", "kai-memory"): 20480 * 2**20 / total,
            ("llm", "llm-big"): 0.75,
            ("llm", "llm-small"): 0.25,
        }
    )
    # HAMi's slots are recognised, the annotation's GPU held; KAI's fraction on its group's GPU,
    # in the container it names
    assert {
        dict(k)["uuid"] for k in series(node.text, "gpu_allocation_info", namespace="hami")
    } == {UUIDS[0]}
    (kai,) = series(node.text, "gpu_allocation_info", pod="kai-memory")
    assert (dict(kai)["uuid"], dict(kai)["container"]) == (UUIDS[2], "main")
    assert value(node.text, "gpu_allocation_in_use", pod="kai-half") == 1


def test_the_kai_reservation_pod_holds_nothing(node: Node) -> None:
    for family in (
        "gpu_allocation_info",
        "gpu_allocation_share_ratio",
        "gpu_pod_busy_seconds_total",
        "gpu_pod_info",
    ):
        assert not series(node.text, family, pod=RESERVATION), family
    assert not node.query(f'allocation:gpu_allocation:share{{pod="{RESERVATION}"}}')


def test_the_rules_record_the_reserved_shares_and_a_gpu_hour_an_hour_at_most(node: Node) -> None:
    recorded = node.query("allocation:gpu_allocation:share")
    assert {key: round(share, 6) for key, share in recorded.items()} == {
        key: round(share, 6) for key, share in shares(node).items()
    }
    per_gpu = node.query("sum by (uuid) (allocation:gpu_allocation:share)")
    assert per_gpu[(UUIDS[0],)] == pytest.approx(1.0, abs=5e-4)  # four 25-core pods: 1.000
    assert per_gpu[(UUIDS[3],)] == pytest.approx(1.0)
    assert per_gpu[(UUIDS[2],)] < 1.0  # half of it and a quarter-ish, the rest reserved by none
    # GPU-hours held per GPU per hour: each holder's recorded share averaged over the last 10 s
    hourly = node.query("sum by (uuid) (avg_over_time(allocation:gpu_allocation:share[10s]))")
    assert hourly.get((UUIDS[0],)) == pytest.approx(1.0, abs=5e-4), hourly
    assert all(hours <= 1.0 + 1e-9 for hours in hourly.values())
