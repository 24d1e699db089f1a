"""cgroup file -> (pod UID, container id): the pure parser on strings, and the procfs reader on
the fixture tree (tests/fixtures/proc)."""

from __future__ import annotations

import logging
import shutil
from typing import TYPE_CHECKING

import pytest

from exporter.attribution.cgroups import (
    CgroupFormatError,
    ContainerRef,
    container_from_cgroup_file,
    container_from_cgroup_path,
)
from exporter.attribution.procfs import ProcessContainers
from tests.proc_fixture import EXPECTED, MALFORMED, PROC, STATIC_UID, container_id, pod_uid

if TYPE_CHECKING:
    from pathlib import Path

UID = "7c3f9a52-1d2e-4b7a-9c21-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
ID = "ab" * 32
REF = ContainerRef(UID, ID)


@pytest.mark.parametrize(
    "path",
    [
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope/container",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{ID}.scope",
        f"/kubepods/burstable/pod{UID}/{ID}",
        f"/kubepods/besteffort/pod{UID}/{ID}",
        f"/kubepods/pod{UID}/{ID}",
        f"/kubepods/besteffort/pod{UID}/crio-{ID}",
        f"/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{ID}",
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
        f"/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
        f"/../../../kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope",
        f"/../../pod{UID}/{ID}",
        f"/../besteffort/pod{UID}/{ID}",
        f"/kubepods/burstable/pod{UID}/{ID}/nested/sub-cgroup",
    ],
)
def test_every_kubelet_path_shape_names_its_container(path: str) -> None:
    assert container_from_cgroup_path(path) == REF


@pytest.mark.parametrize(
    "path",
    [
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{ID}.scope",
        f"/kubepods/burstable/pod{STATIC_UID}/{ID}",
    ],
)
def test_static_pods_keep_their_32_hex_uid(path: str) -> None:
    assert container_from_cgroup_path(path) == ContainerRef(STATIC_UID, ID)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/user.slice/user-1000.slice/session-3.scope",
        f"/system.slice/docker-{ID}.scope",
        f"/docker/{ID}",
        "/kubepods.slice/kubepods-burstable.slice",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
        f"/kubepods/burstable/pod{UID}",
        f"/kubepods/burstable/pod{UID}/not-a-container",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope",
        f"/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:crio-conmon:{ID}",
        f"/somewhere/pod{UID}/{ID}",  # a directory that only looks like a pod
        f"/kubepods/burstable/pod{UID[:-1]}/{ID}",  # a UID one digit short
        f"/kubepods/burstable/pod{UID}/{ID[:-1]}",  # an id one digit short
        f"/kubepods/burstable/pod{UID.upper()}/{ID}",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice/cri-containerd-{ID}.scope",  # dashes where systemd has _
    ],
)
def test_anything_else_attributes_to_no_pod(path: str) -> None:
    assert container_from_cgroup_path(path) is None


def test_v1_files_agree_across_hierarchies_or_answer_none() -> None:
    path = f"/kubepods/burstable/pod{UID}/{ID}"
    agreeing = f"12:pids:{path}\n11:memory:{path}\n1:name=systemd:{path}\n0::/\n"
    assert container_from_cgroup_file(agreeing) == REF
    other = f"/kubepods/burstable/pod{UID}/{'cd' * 32}"
    assert container_from_cgroup_file(f"12:pids:{path}\n11:memory:{other}\n") is None


def test_v2_file() -> None:
    text = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n"
    assert container_from_cgroup_file(text) == REF
    assert container_from_cgroup_file("0::/\n") is None


@pytest.mark.parametrize(
    "text", ["", "\n\n", "garbage\n", "0:/kubepods\n", "x::/\n", "0::relative\n"]
)
def test_malformed_files_raise_a_format_error(text: str) -> None:
    with pytest.raises(CgroupFormatError):
        container_from_cgroup_file(text)


def test_fixture_tree_covers_every_shape() -> None:
    containers, healthy = ProcessContainers(PROC).lookup(EXPECTED)
    assert containers == {pid: ref for pid, ref in EXPECTED.items() if ref is not None}
    assert not healthy  # the malformed files
    assert not MALFORMED & containers.keys()
    assert {ref.pod_uid for ref in containers.values()} >= {pod_uid(1), STATIC_UID}
    assert containers[1001].container_id == container_id(1)


def test_vanished_processes_are_normal_and_malformed_files_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    processes = ProcessContainers(PROC)
    for _ in range(3):
        containers, healthy = processes.lookup([1001, 99999])
        assert containers == {1001: EXPECTED[1001]}
        assert healthy
        _, healthy = processes.lookup([1015, 1016])
        assert not healthy
    assert len([r for r in caplog.records if "malformed" in r.getMessage()]) == 2  # two causes


def test_a_process_is_read_once_and_again_when_its_pid_is_reused(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(PROC / "1001", root / "4242")
    processes = ProcessContainers(root)
    assert processes.lookup([4242])[0] == {4242: EXPECTED[1001]}
    (root / "4242" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-1.scope\n")
    assert processes.lookup([4242])[0] == {4242: EXPECTED[1001]}, "cached for the same process"
    # The process exits and a new one gets its pid: a new procfs directory (made while the old
    # one still exists, so that it is surely another inode).
    shutil.copytree(PROC / "1003", root / "new")
    shutil.rmtree(root / "4242")
    (root / "new").rename(root / "4242")
    assert processes.lookup([4242])[0] == {4242: EXPECTED[1003]}


def test_unreadable_procfs_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "proc"
    (root / "7").mkdir(parents=True)
    (root / "7" / "cgroup").mkdir()  # reading it fails with EISDIR, not "process gone"
    containers, healthy = ProcessContainers(root).lookup([7])
    assert containers == {}
    assert not healthy
    assert any("cannot read" in r.getMessage() for r in caplog.records)
