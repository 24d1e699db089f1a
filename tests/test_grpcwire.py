"""The unary gRPC client (HTTP/2 with h2) against a real grpcio server on a unix socket."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import grpc
import pytest

from exporter.attribution.grpcwire import GrpcCallError, unary_call
from exporter.attribution.podresources import LIST_METHOD
from exporter.attribution.proto.podresources_v1_pb2 import (
    ListPodResourcesRequest,
    ListPodResourcesResponse,
)
from tests.fake_kubelet import (
    ClaimDevice,
    FakeKubelet,
    StallingKubelet,
    claim_allocations,
    gpu_allocations,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

REQUEST = ListPodResourcesRequest().SerializeToString()


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(tmp_path / "kubelet.sock") as server:
        yield server


def call(
    kubelet: FakeKubelet, *, timeout: float = 2.0, limit: int = 16 * 2**20
) -> ListPodResourcesResponse:
    answer = unary_call(
        kubelet.socket, LIST_METHOD, REQUEST, timeout=timeout, max_response_bytes=limit
    )
    return ListPodResourcesResponse.FromString(answer)


def test_an_answer_far_larger_than_the_flow_control_window(kubelet: FakeKubelet) -> None:
    # 3,000 pods are about 500 KiB: many DATA frames, each window update sent back in time.
    kubelet.set(
        gpu_allocations(
            ("ns", f"pod-{n}", "main", "nvidia.com/gpu", [f"GPU-{n:032x}"]) for n in range(3000)
        )
    )
    response = call(kubelet)
    assert len(response.pod_resources) == 3000
    assert response.pod_resources[2999].containers[0].devices[0].device_ids == [f"GPU-{2999:032x}"]


def test_dra_claims_arrive_whole_over_the_h2_path(kubelet: FakeKubelet) -> None:
    # 2,000 pods each holding a GPU through a claim, half of them shares of one device
    kubelet.set(
        {},
        claim_allocations(
            (
                "ns",
                f"pod-{n}",
                "main",
                f"claim-{n}",
                [ClaimDevice(f"gpu-{n % 8}", "node-1", share_id=f"share-{n}" if n % 2 else None)],
            )
            for n in range(2000)
        ),
    )
    response = call(kubelet)
    assert len(response.pod_resources) == 2000
    (claim,) = response.pod_resources[1999].containers[0].dynamic_resources
    assert (claim.claim_name, claim.claim_namespace) == ("claim-1999", "ns")
    (device,) = claim.claim_resources
    assert (device.driver_name, device.pool_name, device.device_name) == (
        "gpu.nvidia.com",
        "node-1",
        "gpu-7",
    )
    assert device.HasField("share_id")
    assert device.share_id == "share-1999"
    assert device.cdi_devices[0].name.startswith("k8s.gpu.nvidia.com/claim=")
    unshared = response.pod_resources[0].containers[0].dynamic_resources[0].claim_resources[0]
    assert not unshared.HasField("share_id"), "optional: absent, not empty, when not shared"


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"),
        (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
    ],
)
def test_failed_calls_carry_the_grpc_status(
    kubelet: FakeKubelet, status: grpc.StatusCode, name: str
) -> None:
    kubelet.failure = status
    with pytest.raises(GrpcCallError) as caught:
        call(kubelet)
    assert caught.value.code == name
    assert "told to fail" in str(caught.value)


def test_a_slow_server_is_a_deadline(kubelet: FakeKubelet) -> None:
    kubelet.delay = 1.0
    with pytest.raises(GrpcCallError) as caught:
        call(kubelet, timeout=0.2)
    assert caught.value.code == "DEADLINE_EXCEEDED"


@pytest.mark.timeout(30)
def test_a_server_that_never_answers_nor_falls_silent_is_a_deadline(tmp_path: Path) -> None:
    """The deadline bounds the whole call: it used to bound only each wait for more bytes, and a
    server sending a PING every millisecond held the call (and the kubelet poller) for ever."""
    with StallingKubelet(tmp_path / "kubelet.sock") as stalling:
        started = time.monotonic()
        with pytest.raises(GrpcCallError) as caught:
            unary_call(stalling.socket, LIST_METHOD, REQUEST, timeout=0.5, max_response_bytes=1000)
        took = time.monotonic() - started
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert took < 5, f"{took:.1f}s for a 0.5 s deadline"


def test_an_answer_over_the_limit_is_refused(kubelet: FakeKubelet) -> None:
    kubelet.set(
        gpu_allocations(("ns", f"pod-{n}", "main", "nvidia.com/gpu", ["x"]) for n in range(100))
    )
    with pytest.raises(GrpcCallError) as caught:
        call(kubelet, limit=1000)
    assert caught.value.code == "RESOURCE_EXHAUSTED"


def test_no_server_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(GrpcCallError) as caught:
        unary_call(
            tmp_path / "absent.sock", LIST_METHOD, REQUEST, timeout=1, max_response_bytes=100
        )
    assert caught.value.code == "UNAVAILABLE"


def test_a_server_that_does_not_speak_http2_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def answer_garbage() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"\xff" * 64)

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        with pytest.raises(GrpcCallError) as caught:
            unary_call(path, LIST_METHOD, REQUEST, timeout=2, max_response_bytes=1000)
        assert caught.value.code in {"INTERNAL", "UNAVAILABLE"}
    finally:
        thread.join(5)
        server.close()
