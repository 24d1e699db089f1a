"""DRA devices from ResourceSlices: pure parsing of the API's slices, then list + watch of
`resource.k8s.io/v1` with the real kubernetes client against the stand-in API server — field
selectors, new pool generations, deletions, and a cluster that serves no such API."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from exporter.attribution.access import resolve_cluster
from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.dra import DeviceIndex, DraDevice, SliceFormatError, slice_from_api
from exporter.attribution.resourceslices import resource_slice_watch
from tests.fake_kube.dra import (
    DRIVER,
    GROUP,
    gpu_device,
    mig_device,
    resource_slice,
    serve_dra,
)
from tests.fake_kube.pods import NODE
from tests.fake_kube.server import FakeKube
from tests.helpers import eventually

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from exporter.attribution.resourceslices import SliceWatch

pytestmark = pytest.mark.timeout(60)
FAST_BACKOFF = (0.05, 0.1, 0.2)
UUID0 = "GPU-2fa81118-5a5f-aa66-7660-471eed407181"
UUID1 = "GPU-3b7c0d2e-1111-2222-3333-444455556666"
MIG0 = "MIG-9e0c3a55-0b57-5b3c-8f4e-1d2c3b4a5f60"


# -- pure: a slice as the API serves it ---------------------------------------------------------


def test_a_slice_names_each_devices_gpu() -> None:
    piece = slice_from_api(
        resource_slice(
            "node-gpu",
            [
                gpu_device("gpu-0", UUID0),
                mig_device("gpu-1-mig-1g10gb-19-0", UUID1, "1g.10gb", MIG0),
                mig_device("gpu-1-mig-3g40gb-9-4", UUID1, "3g.40gb"),
            ],
            generation=3,
        )
    )
    assert (piece.driver, piece.pool, piece.generation) == (DRIVER, NODE, 3)
    assert dict(piece.devices) == {
        "gpu-0": DraDevice(UUID0, memory=80 * 2**30),  # its capacity.memory, 80Gi
        "gpu-1-mig-1g10gb-19-0": DraDevice(MIG0, UUID1, "1g.10gb"),
        "gpu-1-mig-3g40gb-9-4": DraDevice("", UUID1, "3g.40gb"),
    }


def test_attributes_may_carry_the_drivers_domain_and_other_drivers_are_read_alike() -> None:
    document = resource_slice("x", [], driver="gpu.example.com")
    document["spec"]["devices"] = [
        {"name": "dev-0", "attributes": {"gpu.example.com/uuid": {"string": UUID0}}},
        {"name": "dev-1", "attributes": {"uuid": {"int": 7}}},  # not a string: names nothing
        {"attributes": {}},  # no name: skipped
    ]
    piece = slice_from_api(document)
    assert dict(piece.devices) == {"dev-0": DraDevice(UUID0), "dev-1": DraDevice("")}
    assert not DraDevice("").named


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (None, "no spec"),
        ({"pool": {"name": "p"}}, "no spec.driver"),
        ({"driver": "d"}, "no spec.pool"),
        ({"driver": "d", "pool": {"generation": 1}}, "no spec.pool.name"),
        ({"driver": "d", "pool": {"name": "p", "generation": "1"}}, "not a number"),
    ],
)
def test_a_slice_without_its_identity_is_refused(spec: object, problem: str) -> None:
    with pytest.raises(SliceFormatError, match=problem):
        slice_from_api({"spec": spec})


# -- list + watch against the stand-in ------------------------------------------------------------


def slices(generation: int = 1) -> list[dict[str, object]]:
    return [
        resource_slice(
            f"{NODE}-gpu.nvidia.com-a",
            [
                gpu_device("gpu-0", UUID0),
                mig_device("gpu-1-mig-1g10gb-19-0", UUID1, "1g.10gb", MIG0),
            ],
            generation=generation,
            slices_in_pool=2,
        ),
        resource_slice(
            f"{NODE}-gpu.nvidia.com-b",
            [gpu_device("gpu-2", "GPU-2222")],
            generation=generation,
            slices_in_pool=2,
        ),
    ]


@pytest.fixture
def server() -> Iterator[FakeKube]:
    with serve_dra(
        FakeKube(),
        *(("resourceslices", piece) for piece in slices()),
        (
            "resourceslices",
            resource_slice(
                "other-node-slice", [gpu_device("gpu-0", "GPU-other")], node="other-node"
            ),
        ),
        (
            "resourceslices",
            resource_slice(
                "imex", [gpu_device("channel-0", "GPU-imex")], driver="compute-domain.nvidia.com"
            ),
        ),
    ) as fake:
        yield fake


def start_watch(
    server: FakeKube, tmp_path: Path, drivers: tuple[str, ...] = (DRIVER,)
) -> SliceWatch:
    access = resolve_cluster(
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), node_name=NODE, environ={}
    )
    assert access is not None
    watch = resource_slice_watch(
        KubernetesClient(access.configuration), NODE, drivers, backoff=FAST_BACKOFF
    )
    watch.start()
    return watch


def devices(watch: SliceWatch) -> dict[str, str]:
    index: DeviceIndex = watch.view()
    return {device: found.uuid for (_, _, device), found in index.devices.items()}


def test_this_nodes_slices_of_the_driver_are_listed_and_followed(
    server: FakeKube, tmp_path: Path
) -> None:
    watch = start_watch(server, tmp_path)
    try:
        eventually(lambda: len(devices(watch)) == 3, 10, "the node's three devices")
        assert devices(watch) == {
            "gpu-0": UUID0,
            "gpu-1-mig-1g10gb-19-0": MIG0,
            "gpu-2": "GPU-2222",
        }
        status = watch.status()
        assert status is not None
        assert (status.resource, status.up, status.cache_age_seconds, status.objects) == (
            "resourceslices",
            True,
            0.0,
            2,
        )
        # the driver regenerates its pool: a new generation replaces the old, slice by slice
        first = resource_slice(
            f"{NODE}-gpu.nvidia.com-a", [gpu_device("gpu-0", UUID0)], generation=2, slices_in_pool=2
        )
        server.put("resourceslices", first)
        eventually(lambda: set(devices(watch)) == {"gpu-0"}, 10, "only the newest generation")
        server.put("resourceslices", slices(generation=2)[1])
        eventually(lambda: set(devices(watch)) == {"gpu-0", "gpu-2"}, 10, "the second new slice")
        # a slice deleted: its devices go
        server.delete("resourceslices", "", f"{NODE}-gpu.nvidia.com-b")
        eventually(lambda: set(devices(watch)) == {"gpu-0"}, 10, "the deleted slice's devices gone")
    finally:
        watch.stop()
    queries = [q for q in server.requests if "/resourceslices" in q]
    assert queries
    selector = "fieldSelector=spec.nodeName%3Dgpu-node-1%2Cspec.driver%3Dgpu.nvidia.com"
    assert all(selector in q for q in queries)
    assert any("watch=true" in q for q in queries)


def test_several_drivers_are_selected_by_node_and_kept_by_driver(
    server: FakeKube, tmp_path: Path
) -> None:
    server.put(
        "resourceslices",
        resource_slice(
            "imex-here", [gpu_device("channel-0", "GPU-imex")], driver="compute-domain.nvidia.com"
        ),
    )
    server.put(
        "resourceslices",
        resource_slice("example", [gpu_device("dev-0", "GPU-example")], driver="gpu.example.com"),
    )
    watch = start_watch(server, tmp_path, (DRIVER, "gpu.example.com"))
    try:
        eventually(lambda: "dev-0" in devices(watch), 10, "the second driver's device")
        assert set(devices(watch)) == {"gpu-0", "gpu-1-mig-1g10gb-19-0", "gpu-2", "dev-0"}
    finally:
        watch.stop()
    assert all(
        "spec.driver" not in q and "spec.nodeName%3Dgpu-node-1" in q
        for q in server.requests
        if "/resourceslices" in q
    )


def test_410_gone_lists_again(server: FakeKube, tmp_path: Path) -> None:
    watch = start_watch(server, tmp_path)
    try:
        eventually(lambda: len(devices(watch)) == 3, 10, "the node's three devices")
        server.expire()
        server.delete("resourceslices", "", f"{NODE}-gpu.nvidia.com-b")
        eventually(lambda: "gpu-2" not in devices(watch), 10, "the change after 410")
    finally:
        watch.stop()


@pytest.mark.parametrize("older", [True, False], ids=["no resource.k8s.io", "RBAC 403"])
def test_a_cluster_without_the_api_turns_dra_off_once_and_asks_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, older: bool
) -> None:
    caplog.set_level(logging.INFO)
    with serve_dra(FakeKube()) as server:
        if older:
            server.withheld.add(GROUP)
        else:
            server.forbidden.add("resourceslices")
        watch = start_watch(server, tmp_path)
        try:
            eventually(lambda: watch.off, 10, "DRA off")
            assert watch.status() is None
            assert len(watch.view()) == 0
        finally:
            watch.stop()
        assert len(server.requests) == 1, "the first list, and nothing after it"
    off = [r for r in caplog.records if "DRA is off" in r.getMessage()]
    assert len(off) == 1
    assert off[0].status == (404 if older else 403)  # type: ignore[attr-defined]
    assert off[0].levelno == (logging.INFO if older else logging.WARNING)
