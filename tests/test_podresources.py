"""kubelet PodResources: the committed generated code matches the .proto, answers are walked on
the wire (finding what protobuf's own decoder finds, building nothing else, however large the
answer), and the client against a real gRPC server on a unix socket."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import tracemalloc
from typing import TYPE_CHECKING

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.attribution.podresources import (
    MAX_MESSAGE_BYTES,
    MIN_PERIOD_SECONDS,
    PACE,
    STALE_SECONDS,
    AnswerError,
    DeviceAllocation,
    PodResourcesClient,
    allocations_from_answer,
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
    from collections.abc import Callable, Iterator
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


def allocations_from_response(
    response: podresources_v1_pb2.ListPodResourcesResponse,
    matches: Callable[[str], bool],
    drivers: frozenset[str] = frozenset({"gpu.nvidia.com"}),
) -> tuple[DeviceAllocation, ...]:
    """What the client makes of an answer, from the message the kubelet serialized."""
    return allocations_from_answer(response.SerializeToString(), matches, drivers)


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


# -- the answer walked on the wire: the same allocations, nothing else built -----------------------


def reference(
    response: podresources_v1_pb2.ListPodResourcesResponse,
    matches: Callable[[str], bool],
    drivers: frozenset[str],
) -> tuple[DeviceAllocation, ...]:
    """What the client made of an answer when it decoded it whole (protobuf's own parser)."""
    found: list[DeviceAllocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if matches(devices.resource_name):
                    found.extend(
                        DeviceAllocation(
                            pod.namespace, pod.name, container.name, devices.resource_name, id_
                        )
                        for id_ in devices.device_ids
                    )
            for claim in container.dynamic_resources if drivers else ():
                found.extend(
                    DeviceAllocation(
                        pod.namespace,
                        pod.name,
                        container.name,
                        device.driver_name,
                        device.device_name,
                        device.driver_name,
                        device.pool_name,
                        claim.claim_name,
                        claim.claim_namespace,
                        device.share_id,
                    )
                    for device in claim.claim_resources
                    if device.driver_name in drivers and device.device_name
                )
    return tuple(found)


NAMES = st.text(alphabet="ab*\x12-/:é", max_size=6)
DEVICES = st.builds(
    podresources_v1_pb2.ContainerDevices,
    resource_name=st.sampled_from([GPU, "nvidia.com/mig-1g.10gb", "example.com/nic", ""]),
    device_ids=st.lists(NAMES, max_size=3),
)
CLAIM_DEVICES = st.builds(
    podresources_v1_pb2.ClaimResource,
    driver_name=st.sampled_from(["gpu.nvidia.com", "other.example.com", ""]),
    pool_name=NAMES,
    device_name=NAMES,
    share_id=st.none() | NAMES,
)
CONTAINERS = st.builds(
    podresources_v1_pb2.ContainerResources,
    name=NAMES,
    devices=st.lists(DEVICES, max_size=2),
    cpu_ids=st.lists(st.integers(0, 2**40), max_size=3),
    memory=st.lists(
        st.builds(
            podresources_v1_pb2.ContainerMemory, memory_type=NAMES, size=st.integers(0, 2**64 - 1)
        ),
        max_size=1,
    ),
    dynamic_resources=st.lists(
        st.builds(
            podresources_v1_pb2.DynamicResource,
            claim_name=NAMES,
            claim_namespace=NAMES,
            claim_resources=st.lists(CLAIM_DEVICES, max_size=2),
        ),
        max_size=2,
    ),
)
RESPONSES = st.builds(
    podresources_v1_pb2.ListPodResourcesResponse,
    pod_resources=st.lists(
        st.builds(
            podresources_v1_pb2.PodResources,
            name=NAMES,
            namespace=NAMES,
            containers=st.lists(CONTAINERS, max_size=3),
        ),
        max_size=4,
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=RESPONSES, drivers=st.sampled_from([frozenset(), frozenset({"gpu.nvidia.com"})]))
def test_the_wire_walk_finds_what_a_whole_decode_finds(
    response: podresources_v1_pb2.ListPodResourcesResponse, drivers: frozenset[str]
) -> None:
    matches = resource_matcher()
    answer = response.SerializeToString() + b"\x78\x01"  # and a field this proto does not know
    assert allocations_from_answer(answer, matches, drivers) == reference(
        response, matches, drivers
    )


@pytest.mark.parametrize(
    "answer", [b"\x0a\x05ab", b"\x0a\x80", b"\x0b", b"\x0a\x02\x1a\x05"], ids=str
)
def test_an_answer_that_is_not_protobuf_is_one_error(answer: bytes) -> None:
    with pytest.raises(AnswerError):
        allocations_from_answer(answer, resource_matcher())


def test_a_blown_up_answer_costs_neither_memory_nor_the_kubelet_s_rate(
    kubelet: FakeKubelet,
) -> None:
    """Tenant pods of thousands of containers each: 15 MiB of answer, every container walked past
    without anything built for it, and the kubelet asked again only after PACE times as long."""
    huge = podresources_v1_pb2.ListPodResourcesResponse(
        pod_resources=[
            podresources_v1_pb2.PodResources(
                name=f"tenant-{n}",
                namespace="tenant",
                containers=[
                    podresources_v1_pb2.ContainerResources(name=f"c{i}", cpu_ids=[1, 2])
                    for i in range(12_000)
                ],
            )
            for n in range(100)
        ]
        + list(response(ALLOCATIONS).pod_resources)
    )
    answer = huge.SerializeToString()
    assert 14 * 2**20 < len(answer) < MAX_MESSAGE_BYTES
    tracemalloc.start()
    try:
        found = allocations_from_answer(answer, resource_matcher())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {a.device_id for a in found} == {"GPU-aaaa", "GPU-bbbb::0", "MIG-cccc"}
    assert peak < 2 * 2**20, f"{peak:,} bytes held walking a {len(answer):,}-byte answer"

    with kubelet.lock:
        kubelet.answer = huge
    ticks = ManualClock()

    def clock() -> float:  # every reading a second later: each answer "takes" a second
        ticks.advance(1.0)
        return ticks()

    client = PodResourcesClient(kubelet.socket, clock=clock)
    client.allocations()
    for _ in range(8):
        client.allocations()
    assert kubelet.calls == 1, "asked again only PACE x 1 s later"
    assert PACE * 1.0 > MIN_PERIOD_SECONDS
