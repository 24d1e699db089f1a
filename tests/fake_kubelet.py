"""A real gRPC server on a unix socket serving the kubelet's PodResources v1 `List`, from the
same proto gpuscope's client uses: device-plugin devices, and DRA claims' devices
(`dynamic_resources`, with CDI device names and `share_id` where a device's capacity is shared);
and a kubelet that stalls, never answering while never falling silent (`StallingKubelet`)."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from exporter.attribution.proto.podresources_v1_pb2 import (
    CDIDevice,
    ClaimResource,
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    DynamicResource,
    ListPodResourcesRequest,
    ListPodResourcesResponse,
    PodResources,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

Allocations = Mapping[tuple[str, str], Mapping[str, Mapping[str, Sequence[str]]]]
"""(namespace, pod) -> container -> resource name -> device ids"""


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA claim, as the kubelet names it."""

    device: str
    pool: str
    driver: str = "gpu.nvidia.com"
    share_id: str | None = None


Claims = Mapping[tuple[str, str], Mapping[str, Mapping[tuple[str, str], Sequence[ClaimDevice]]]]
"""(namespace, pod) -> container -> (claim namespace, claim name) -> its devices"""


def response(allocations: Allocations, claims: Claims | None = None) -> ListPodResourcesResponse:
    """A List answer as the kubelet gives it, CPU and memory assignments included."""
    claims = claims or {}
    pods = {key: dict.fromkeys(containers) for key, containers in allocations.items()}
    for key, containers in claims.items():
        pods.setdefault(key, {}).update(dict.fromkeys(containers))
    return ListPodResourcesResponse(
        pod_resources=[
            PodResources(
                namespace=namespace,
                name=name,
                containers=[
                    ContainerResources(
                        name=container,
                        devices=[
                            ContainerDevices(resource_name=resource, device_ids=list(ids))
                            for resource, ids in allocations.get((namespace, name), {})
                            .get(container, {})
                            .items()
                        ],
                        cpu_ids=[2, 3],
                        memory=[ContainerMemory(memory_type="memory", size=2**30)],
                        dynamic_resources=[
                            _dynamic_resource(claim, devices)
                            for claim, devices in claims.get((namespace, name), {})
                            .get(container, {})
                            .items()
                        ],
                    )
                    for container in containers
                ],
            )
            for (namespace, name), containers in pods.items()
        ]
    )


def _dynamic_resource(claim: tuple[str, str], devices: Sequence[ClaimDevice]) -> DynamicResource:
    namespace, name = claim
    return DynamicResource(
        claim_name=name,
        claim_namespace=namespace,
        claim_resources=[
            ClaimResource(
                cdi_devices=[
                    CDIDevice(name=f"k8s.{item.driver}/claim={namespace}-{name}-{item.device}")
                ],
                driver_name=item.driver,
                pool_name=item.pool,
                device_name=item.device,
                share_id=item.share_id,
            )
            for item in devices
        ],
    )


class FakeKubelet:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.answer = ListPodResourcesResponse()
        self.delay = 0.0
        self.failure: grpc.StatusCode | None = None
        self.trailing_bytes = b""
        """Appended to every answer: fields a newer kubelet might send (the client must ignore)."""
        self.calls = 0
        self.lock = threading.Lock()
        """Held while the answer is read or replaced."""
        self._server: grpc.Server | None = None

    def set(self, allocations: Allocations, claims: Claims | None = None) -> None:
        with self.lock:
            self.answer = response(allocations, claims)

    def start(self) -> FakeKubelet:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=ListPodResourcesRequest.FromString,
                    response_serializer=lambda answer: (
                        answer.SerializeToString() + self.trailing_bytes
                    ),
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _list(
        self, _request: ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> ListPodResourcesResponse:
        with self.lock:
            self.calls += 1
            answer, failure, delay = self.answer, self.failure, self.delay
        if delay:
            time.sleep(delay)
        if failure is not None:
            context.abort(failure, "the fake kubelet was told to fail")
        return answer


def gpu_allocations(
    entries: Iterable[tuple[str, str, str, str, Sequence[str]]],
) -> dict[tuple[str, str], dict[str, dict[str, list[str]]]]:
    """(namespace, pod, container, resource, ids) rows -> the nested form `set` takes."""
    nested: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    for namespace, pod, container, resource, ids in entries:
        nested.setdefault((namespace, pod), {}).setdefault(container, {}).setdefault(
            resource, []
        ).extend(ids)
    return nested


def claim_allocations(
    entries: Iterable[tuple[str, str, str, str, Sequence[ClaimDevice]]],
) -> dict[tuple[str, str], dict[str, dict[tuple[str, str], list[ClaimDevice]]]]:
    """(namespace, pod, container, claim, devices) rows -> the nested form `set` takes (a
    claim lives in its pod's namespace)."""
    nested: dict[tuple[str, str], dict[str, dict[tuple[str, str], list[ClaimDevice]]]] = {}
    for namespace, pod, container, claim, devices in entries:
        nested.setdefault((namespace, pod), {}).setdefault(container, {}).setdefault(
            (namespace, claim), []
        ).extend(devices)
    return nested


class StallingKubelet:
    """A kubelet that never answers and never falls silent: on a unix socket, it opens HTTP/2
    (a SETTINGS frame) and then sends PING frames as fast as the client takes them, reading and
    dropping whatever the client sends. A client that waits for a quiet moment to time out
    waits for ever; one that keeps a deadline gives up at it."""

    _SETTINGS: bytes = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    _PING: bytes = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"gpuscope"

    def __init__(self, socket_path: Path) -> None:
        self.socket = socket_path
        self.connections = 0
        self._stopping = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._threads: list[threading.Thread] = []

    def start(self) -> StallingKubelet:
        self._server.bind(str(self.socket))
        self._server.listen(8)
        self._server.settimeout(0.2)
        self._spawn(self._accept)
        return self

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(5)
        self._server.close()

    def __enter__(self) -> StallingKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            self._spawn(functools.partial(self._drain, connection))
            self._spawn(functools.partial(self._flood, connection))

    def _drain(self, connection: socket.socket) -> None:
        connection.settimeout(0.2)
        while not self._stopping.is_set():
            try:
                if not connection.recv(65536):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def _flood(self, connection: socket.socket) -> None:
        pings = self._PING * 32
        try:
            connection.sendall(self._SETTINGS)
            while not self._stopping.is_set():
                connection.sendall(pings)
        except OSError:
            return  # the client hung up
        finally:
            connection.close()
