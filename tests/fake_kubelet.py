"""A real gRPC server on a unix socket serving the kubelet's PodResources v1 `List`, from the
same proto gpuscope's client uses."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc

from exporter.attribution.proto.podresources_v1_pb2 import (
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    ListPodResourcesRequest,
    ListPodResourcesResponse,
    PodResources,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

Allocations = Mapping[tuple[str, str], Mapping[str, Mapping[str, Sequence[str]]]]
"""(namespace, pod) -> container -> resource name -> device ids"""


def response(allocations: Allocations) -> ListPodResourcesResponse:
    """A List answer as the kubelet gives it, CPU and memory assignments included."""
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
                            for resource, ids in devices.items()
                        ],
                        cpu_ids=[2, 3],
                        memory=[ContainerMemory(memory_type="memory", size=2**30)],
                    )
                    for container, devices in containers.items()
                ],
            )
            for (namespace, name), containers in allocations.items()
        ]
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
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def set(self, allocations: Allocations) -> None:
        with self._lock:
            self.answer = response(allocations)

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
        with self._lock:
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
