"""kubelet PodResources: the committed generated code matches the .proto, answers are read
field by field, and the client against a real gRPC server on a unix socket."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from typing import TYPE_CHECKING

import grpc
import pytest

from exporter.attribution.podresources import (
    MIN_PERIOD_SECONDS,
    STALE_SECONDS,
    DeviceAllocation,
    PodResourcesClient,
    allocations_from_response,
    resource_matcher,
)
from exporter.attribution.proto import podresources_v1_pb2
from tests.fake_kubelet import (
    ClaimDevice,
    FakeKubelet,
    claim_allocations,
    gpu_allocations,
    response,
)
from tests.helpers import ROOT, ManualClock

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PROTO_DIR = ROOT / "exporter" / "attribution" / "proto"
GPU = "nvidia.com/gpu"
ALLOCATIONS = gpu_allocations(
    [
        ("ml", "trainer", "main", GPU, ["GPU-aaaa"]),
        ("ml", "trainer", "main", "example.com/nic", ["nic-1"]),
        ("ml", "infer", "server", GPU, ["GPU-bbbb::0"]),
        ("ml", "infer", "server", "nvidia.com/mig-1g.10gb", ["MIG-cccc"]),
        ("web", "frontend", "nginx", "cpu-only/none", []),
    ]
)


def test_generated_module_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={tmp_path}",
            str(PROTO_DIR / "podresources_v1.proto"),
        ],
        check=True,
        timeout=60,
    )
    spec = importlib.util.spec_from_file_location("fresh_pb2", tmp_path / "podresources_v1_pb2.py")
    assert spec is not None
    assert spec.loader is not None
    source = (tmp_path / "podresources_v1_pb2.py").read_text()
    fresh = source[source.index("AddSerializedFile(") :].split(")\n", 1)[0]
    committed = (PROTO_DIR / "podresources_v1_pb2.py").read_text()
    assert fresh == committed[committed.index("AddSerializedFile(") :].split(")\n", 1)[0], (
        "regenerate podresources_v1_pb2.py from the .proto (command in its header)"
    )
    service = podresources_v1_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert {method.name for method in service.methods} == {"List", "GetAllocatableResources", "Get"}


def test_only_gpu_resources_and_configured_extras_are_read() -> None:
    answer = response(ALLOCATIONS)
    found = allocations_from_response(answer, resource_matcher())
    assert found == (
        DeviceAllocation("ml", "trainer", "main", GPU, "GPU-aaaa"),
        DeviceAllocation("ml", "infer", "server", GPU, "GPU-bbbb::0"),
        DeviceAllocation("ml", "infer", "server", "nvidia.com/mig-1g.10gb", "MIG-cccc"),
    )
    extra = allocations_from_response(answer, resource_matcher(["example.com/*"]))
    assert DeviceAllocation("ml", "trainer", "main", "example.com/nic", "nic-1") in extra


CLAIMS = claim_allocations(
    [
        ("ml", "trainer", "main", "trainer-gpu", [ClaimDevice("gpu-0", "node-1")]),
        ("ml", "pair-a", "main", "pair", [ClaimDevice("gpu-1", "node-1")]),
        ("ml", "pair-b", "server", "pair", [ClaimDevice("gpu-1", "node-1")]),
        ("ml", "cap-a", "main", "cap-a", [ClaimDevice("gpu-2", "node-1", share_id="5e2f")]),
        (
            "ml",
            "imex",
            "main",
            "channel",
            [ClaimDevice("channel-0", "node-1", driver="compute-domain.nvidia.com")],
        ),
    ]
)


def dra(allocation: DeviceAllocation) -> tuple[str, ...]:
    return (
        allocation.pod,
        allocation.container,
        allocation.claim,
        allocation.driver,
        allocation.pool,
        allocation.device_id,
        allocation.share_id,
    )


def test_dra_devices_are_read_with_their_claim_and_share() -> None:
    answer = response(ALLOCATIONS, CLAIMS)
    found = allocations_from_response(answer, resource_matcher())
    plugin = [a for a in found if not a.driver]
    assert len(plugin) == 3, "device-plugin devices are read as before"
    claimed = [a for a in found if a.driver]
    assert [dra(a) for a in claimed] == [
        ("trainer", "main", "trainer-gpu", "gpu.nvidia.com", "node-1", "gpu-0", ""),
        ("pair-a", "main", "pair", "gpu.nvidia.com", "node-1", "gpu-1", ""),
        ("pair-b", "server", "pair", "gpu.nvidia.com", "node-1", "gpu-1", ""),
        ("cap-a", "main", "cap-a", "gpu.nvidia.com", "node-1", "gpu-2", "5e2f"),
    ], "only the configured drivers' devices (not the IMEX channel)"
    assert {(a.resource, a.claim_namespace) for a in claimed} == {("gpu.nvidia.com", "ml")}
    assert not [
        a for a in allocations_from_response(answer, resource_matcher(), frozenset()) if a.driver
    ], "DRA off: no claim is read"
    imex = allocations_from_response(
        answer, resource_matcher(), frozenset({"compute-domain.nvidia.com"})
    )
    assert [a.device_id for a in imex if a.driver] == ["channel-0"]


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(tmp_path / "kubelet.sock") as fake:
        fake.set(ALLOCATIONS)
        yield fake


def test_lists_allocations_over_the_socket(kubelet: FakeKubelet) -> None:
    kubelet.trailing_bytes = b"\x78\x01"  # field 15, varint 1: unknown to this proto
    client = PodResourcesClient(kubelet.socket)
    allocations, healthy = client.allocations()
    assert healthy
    assert allocations is not None
    assert {a.device_id for a in allocations} == {"GPU-aaaa", "GPU-bbbb::0", "MIG-cccc"}


def test_claims_are_listed_over_the_socket(kubelet: FakeKubelet) -> None:
    kubelet.set(ALLOCATIONS, CLAIMS)
    allocations, healthy = PodResourcesClient(kubelet.socket).allocations()
    assert healthy
    assert allocations is not None
    assert {a.device_id for a in allocations if a.driver} == {"gpu-0", "gpu-1", "gpu-2"}
    off, _ = PodResourcesClient(kubelet.socket, dra_drivers=()).allocations()
    assert off is not None
    assert {a.device_id for a in off} == {"GPU-aaaa", "GPU-bbbb::0", "MIG-cccc"}


def test_asked_on_the_samplers_clock_at_most_once_per_period(kubelet: FakeKubelet) -> None:
    clock = ManualClock()
    client = PodResourcesClient(kubelet.socket, clock=clock)
    for _ in range(10):
        client.allocations()
        clock.advance(MIN_PERIOD_SECONDS / 4)
    assert kubelet.calls == 3
    kubelet.set({})
    clock.advance(MIN_PERIOD_SECONDS)
    assert client.allocations() == ((), True)


def test_failures_keep_the_last_answer_for_a_while(
    kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    client = PodResourcesClient(kubelet.socket, clock=clock, timeout=0.2)
    first, _ = client.allocations()
    kubelet.failure = grpc.StatusCode.UNAVAILABLE
    for _ in range(5):
        clock.advance(MIN_PERIOD_SECONDS)
        assert client.allocations() == (first, False)
    kubelet.failure = None
    kubelet.delay = 1.0  # slower than the timeout
    clock.advance(MIN_PERIOD_SECONDS)
    assert client.allocations() == (first, False)
    kubelet.delay = 0.0
    kubelet.failure = grpc.StatusCode.UNAVAILABLE
    clock.advance(STALE_SECONDS)
    assert client.allocations() == (None, False)
    kubelet.failure = None
    clock.advance(MIN_PERIOD_SECONDS)
    assert client.allocations() == (first, True)
    failures = [r for r in caplog.records if "List failed" in r.getMessage()]
    assert [r.code for r in failures] == ["UNAVAILABLE", "DEADLINE_EXCEEDED"]  # type: ignore[attr-defined]
    assert any("answers" in r.getMessage() for r in caplog.records)


def test_a_missing_socket_disables_only_this_source_until_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    socket = tmp_path / "kubelet.sock"
    clock = ManualClock()
    client = PodResourcesClient(socket, clock=clock)
    for _ in range(3):
        assert client.allocations() == (None, False)
        clock.advance(MIN_PERIOD_SECONDS)
    with FakeKubelet(socket) as kubelet:
        kubelet.set(ALLOCATIONS)
        allocations, healthy = client.allocations()
    assert healthy
    assert allocations
    assert (
        len([r for r in caplog.records if "no kubelet pod-resources socket" in r.getMessage()]) == 1
    )
