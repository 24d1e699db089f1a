"""The resource name of a DRA allocation: its claim's DeviceClass's extended resource name, read
with one GET per claim and per class from the stand-in API server by the real kubernetes client;
the driver's name where the class has none or nothing can be read."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from exporter.attribution import claims
from exporter.attribution.access import resolve_cluster
from exporter.attribution.claims import ClaimResources, claim_classes, extended_resource_name
from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.podresources import DeviceAllocation
from tests.fake_kube.dra import (
    DRIVER,
    GROUP,
    NVIDIA_CLASSES,
    device_class,
    resource_claim,
    serve_dra,
)
from tests.fake_kube.pods import NODE
from tests.fake_kube.server import FakeKube
from tests.helpers import ManualClock

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)


def held(pod: str, claim: str, device: str, share_id: str = "") -> DeviceAllocation:
    return DeviceAllocation("ml", pod, "main", DRIVER, device, DRIVER, NODE, claim, "ml", share_id)


ALLOCATIONS = (
    DeviceAllocation("ml", "plugin", "main", "nvidia.com/gpu", "GPU-aaaa"),
    held("trainer", "trainer-gpu", "gpu-0"),
    held("pair-a", "pair", "gpu-1"),
    held("pair-b", "pair", "gpu-1"),
    held("small", "small-mig", "gpu-2-mig-1g10gb-19-0"),
    held("chooser", "chooser", "gpu-3"),
    held("cap", "cap", "gpu-4", share_id="5e2f"),
)


@pytest.fixture
def server() -> Iterator[FakeKube]:
    with serve_dra(
        FakeKube(),
        ("resourceclaims", resource_claim("trainer-gpu", "ml", ["gpu-0"])),
        ("resourceclaims", resource_claim("pair", "ml", ["gpu-1"])),
        (
            "resourceclaims",
            resource_claim(
                "small-mig", "ml", ["gpu-2-mig-1g10gb-19-0"], device_class="mig.nvidia.com"
            ),
        ),
        ("resourceclaims", resource_claim("chooser", "ml", ["gpu-3"], first_available=True)),
        (
            "resourceclaims",
            resource_claim("cap", "ml", ["gpu-4", "gpu-5"], share_ids=["5e2f", "77aa"]),
        ),
    ) as fake:
        yield fake


def resources(server: FakeKube, tmp_path: Path, **kwargs: object) -> ClaimResources:
    access = resolve_cluster(
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), node_name=NODE, environ={}
    )
    assert access is not None
    return ClaimResources(KubernetesClient(access.configuration), active=lambda: True, **kwargs)  # type: ignore[arg-type]


def names(allocations: tuple[DeviceAllocation, ...]) -> dict[str, str]:
    return {allocation.pod: allocation.resource for allocation in allocations}


def test_the_claims_device_class_names_the_resource(server: FakeKube, tmp_path: Path) -> None:
    found = resources(server, tmp_path)
    try:
        resolved = found.resolve(ALLOCATIONS)
    finally:
        found.close()
    assert names(resolved) == {
        "plugin": "nvidia.com/gpu",  # a device plugin's, untouched
        "trainer": "nvidia.com/gpu",  # class gpu.nvidia.com: extendedResourceName
        "pair-a": "nvidia.com/gpu",
        "pair-b": "nvidia.com/gpu",
        "small": DRIVER,  # class mig.nvidia.com has no extended resource: the driver's name
        "chooser": "nvidia.com/gpu",  # chosen among firstAvailable
        "cap": "nvidia.com/gpu",  # a share, matched by its share id
    }
    gets = [q for q in server.requests if "/resourceclaims/" in q or "/deviceclasses/" in q]
    assert sorted(gets) == sorted(
        [
            f"/apis/{GROUP}/v1/namespaces/ml/resourceclaims/{claim}"
            for claim in ("trainer-gpu", "pair", "small-mig", "chooser", "cap")
        ]
        + [f"/apis/{GROUP}/v1/deviceclasses/{name}" for name in (DRIVER, "mig.nvidia.com")]
    ), "one GET per claim and per class, nothing listed"


def test_claims_are_read_once_and_classes_again_after_a_while(
    server: FakeKube, tmp_path: Path
) -> None:
    clock = ManualClock()
    found = resources(server, tmp_path, clock=clock)
    try:
        first = found.resolve(ALLOCATIONS)
        asked = len(server.requests)
        clock.advance(60)
        assert found.resolve(ALLOCATIONS) is first, "nothing changed: the same answer"
        again = (*ALLOCATIONS[:2],)  # a new answer from the kubelet, the same claims
        assert names(found.resolve(again)) == {
            "plugin": "nvidia.com/gpu",
            "trainer": "nvidia.com/gpu",
        }
        assert len(server.requests) == asked
        server.put(
            "deviceclasses", device_class(DRIVER, kind="gpu", extended_resource="example.com/gpu")
        )
        clock.advance(claims.CLASS_SECONDS)
        assert names(found.resolve(again))["trainer"] == "example.com/gpu"
        assert len(server.requests) == asked + 1, "the class read again, not the claim"
    finally:
        found.close()


def test_what_cannot_be_read_carries_the_drivers_name(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    clock = ManualClock()
    found = resources(server, tmp_path, clock=clock)
    try:
        gone = (held("ghost", "no-such-claim", "gpu-7"),)
        assert names(found.resolve(gone)) == {"ghost": DRIVER}
        server.failure = 500
        assert names(found.resolve((held("trainer", "trainer-gpu", "gpu-0"),))) == {
            "trainer": DRIVER
        }
        server.failure = None
        clock.advance(claims.RETRY_SECONDS)
        assert names(found.resolve((held("trainer", "trainer-gpu", "gpu-0"),))) == {
            "trainer": "nvidia.com/gpu"
        }, "asked again after a while"
        server.forbidden.add("resourceclaims")
        asked = len(server.requests)
        for _ in range(3):
            assert names(found.resolve((held("pair-a", "pair", "gpu-1"),))) == {"pair-a": DRIVER}
        assert len(server.requests) == asked + 1, "refused once: not asked again"
    finally:
        found.close()
    refused = [r for r in caplog.records if "RBAC does not allow" in r.getMessage()]
    assert len(refused) == 1
    failed = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert len(failed) == 1


def test_nothing_is_asked_while_dra_is_off(server: FakeKube, tmp_path: Path) -> None:
    access = resolve_cluster(
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), node_name=NODE, environ={}
    )
    assert access is not None
    found = ClaimResources(KubernetesClient(access.configuration), active=lambda: False)
    try:
        assert found.resolve(ALLOCATIONS) is ALLOCATIONS
    finally:
        found.close()
    assert server.requests == []


def test_a_round_asks_at_most_its_share_and_the_rest_next_round(
    server: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "READS_PER_ROUND", 2)
    found = resources(server, tmp_path)
    try:
        answers = []
        for _ in range(6):
            before = len(server.requests)
            answers.append(names(found.resolve(ALLOCATIONS)))
            assert len(server.requests) - before <= 2
    finally:
        found.close()
    assert (answers[0]["trainer"], answers[0]["pair-a"]) == ("nvidia.com/gpu", DRIVER)
    assert answers[-1] == {**dict.fromkeys(answers[-1], "nvidia.com/gpu"), "small": DRIVER}


def test_claim_and_class_documents_are_read_field_by_field() -> None:
    claim = resource_claim("cap", "ml", ["gpu-4", "gpu-5"], share_ids=["5e2f", None])
    assert claim_classes(claim) == {
        (DRIVER, NODE, "gpu-4", "5e2f"): DRIVER,
        (DRIVER, NODE, "gpu-5", ""): DRIVER,
    }
    assert claim_classes({"status": {"allocation": None}}) == {}
    assert claim_classes("not a claim") == {}
    assert extended_resource_name(NVIDIA_CLASSES[0]) == "nvidia.com/gpu"
    assert extended_resource_name(NVIDIA_CLASSES[1]) is None
