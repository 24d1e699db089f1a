"""The daemon's profile source on real files: change detection, ConfigMap symlink swaps, bad
profiles, and the ceilings joined from profiles and the catalog."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from exporter.calibration.parse import MAX_PROFILE_BYTES
from exporter.calibration.profile import configmap_key, dump_profile
from exporter.calibration.source import CeilingsSource, ProfileDirectory, ceilings_for
from exporter.catalog import builtin_catalog
from tests.profiles import gpu_profile
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.calibration.profile import Profile

H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"


def write(path: Path, profile: Profile, fmt: str = "json") -> Path:
    path.write_text(dump_profile(profile, fmt))  # type: ignore[arg-type]
    return path


def configmap_volume(root: Path, files: dict[str, str], generation: int) -> None:
    """Lay out `root` as the kubelet mounts a ConfigMap: keys are symlinks through `..data`,
    which points at a timestamped directory and is swapped atomically on an update."""
    root.mkdir(exist_ok=True)
    version = root / f"..2026_11_22_0{generation}"
    version.mkdir()
    for key, text in files.items():
        (version / key).write_text(text)
    staging = root / "..data_tmp"
    staging.symlink_to(version.name)
    os.replace(staging, root / "..data")
    for key in files:
        link = root / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")


def test_single_file(tmp_path: Path) -> None:
    directory = ProfileDirectory(write(tmp_path / "h100.yaml", gpu_profile(), "yaml"))
    directory.refresh()
    assert [profile.model for profile in directory.profiles] == [H100]
    assert directory.healthy


def test_directory_ignores_hidden_and_other_files_and_reloads_only_on_change(
    tmp_path: Path,
) -> None:
    write(tmp_path / "h100.json", gpu_profile())
    write(tmp_path / "l4.yml", gpu_profile(L4, catalog_key="l4"), "yaml")
    (tmp_path / ".h100.json.123.tmp").write_text("half a profi")
    (tmp_path / "README.txt").write_text("not a profile")
    directory = ProfileDirectory(tmp_path)
    directory.refresh()
    assert sorted(p.model for p in directory.profiles) == [H100, L4]
    assert directory.generation == 1
    directory.refresh()
    directory.refresh()
    assert directory.generation == 1, "unchanged files are not read again"
    write(tmp_path / "h100.json", gpu_profile(duration_seconds=123.456))
    directory.refresh()
    assert directory.generation == 2
    assert {p.model: p.duration_seconds for p in directory.profiles}[H100] == 123.456


def test_a_configmap_update_through_the_data_symlink_is_seen(tmp_path: Path) -> None:
    root = tmp_path / "calibration"
    key = configmap_key(H100)
    configmap_volume(root, {key: dump_profile(gpu_profile())}, generation=1)
    directory = ProfileDirectory(root)
    directory.refresh()
    assert directory.profiles[0].duration_seconds == 74.2
    configmap_volume(
        root,
        {
            key: dump_profile(gpu_profile(duration_seconds=50.0)),
            configmap_key(L4): dump_profile(gpu_profile(L4)),
        },
        generation=2,
    )
    directory.refresh()
    assert {p.model: p.duration_seconds for p in directory.profiles} == {H100: 50.0, L4: 74.2}


def test_a_corrupt_profile_is_rejected_once_and_the_rest_keeps_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "h100.json", gpu_profile())
    broken = tmp_path / "l4.json"
    broken.write_text('{"kind": "gpuscope/calibration-profile", "version": 1, "model": ')
    directory = ProfileDirectory(tmp_path)
    with caplog.at_level(logging.INFO, logger="exporter.calibration"):
        for _ in range(5):
            directory.refresh()
    rejected = [
        r for r in caplog.records if r.getMessage().startswith("calibration profile rejected")
    ]
    assert len(rejected) == 1
    assert rejected[0].file == str(broken)  # type: ignore[attr-defined]
    assert "l4.json: not valid JSON" in rejected[0].error  # type: ignore[attr-defined]
    assert [p.model for p in directory.profiles] == [H100]
    assert not directory.healthy
    write(broken, gpu_profile(L4))
    directory.refresh()
    assert directory.healthy
    assert len(directory.profiles) == 2


@pytest.mark.timeout(60)
def test_hostile_profiles_cost_only_themselves_and_one_log_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "h100.json", gpu_profile())
    valid = dump_profile(gpu_profile(L4), "yaml")
    hostile = {
        "bomb.yaml": (alias_bomb().encode(), "expands to more than 100,000 values"),
        "binary.json": (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (byte 0 is 0x89)"),
        "twice.yaml": (
            (valid + "quick: true\n").encode(),
            "key 'quick' appears twice in one mapping",
        ),
        "big.yaml": (
            valid.encode() + b"#" * MAX_PROFILE_BYTES,
            "larger than 1 MiB (the limit)",
        ),
    }
    for name, (content, _) in hostile.items():
        (tmp_path / name).write_bytes(content)
    # A FIFO was skipped in silence: it reads as nothing at all, so it is said once too.
    os.mkfifo(tmp_path / "fifo.yaml")
    hostile["fifo.yaml"] = (b"", "not a regular file (a FIFO)")
    directory = ProfileDirectory(tmp_path)
    with caplog.at_level(logging.INFO, logger="exporter.calibration"):
        for _ in range(3):
            directory.refresh()
    assert [p.model for p in directory.profiles] == [H100]
    assert not directory.healthy
    rejected = {
        record.file: record.error  # type: ignore[attr-defined]
        for record in caplog.records
        if record.getMessage().startswith("calibration profile rejected")
    }
    assert (
        len(rejected)
        == len(hostile)
        == sum(r.getMessage().startswith("calibration profile rejected") for r in caplog.records)
    ), "one line per file"
    for name, (_, problem) in hostile.items():
        error = rejected[str(tmp_path / name)]
        assert error.startswith(f"{name}: {problem}"), error
        assert "\n" not in error


def test_an_unreadable_path_drops_the_profiles_until_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "profiles"
    root.mkdir()
    write(root / "h100.json", gpu_profile())
    directory = ProfileDirectory(root)
    directory.refresh()
    (root / "h100.json").rename(tmp_path / "h100.json")
    root.rmdir()
    with caplog.at_level(logging.WARNING, logger="exporter.calibration"):
        directory.refresh()
        directory.refresh()
    assert directory.profiles == ()
    assert not directory.healthy
    assert [r.getMessage() for r in caplog.records] == [
        "calibration path unreadable; no calibrated series until it is back"
    ]
    root.mkdir()
    (tmp_path / "h100.json").rename(root / "h100.json")
    directory.refresh()
    assert directory.healthy
    assert len(directory.profiles) == 1


def test_the_newest_measurement_of_a_model_wins(tmp_path: Path) -> None:
    write(tmp_path / "a.json", gpu_profile(measured_at="2026-11-21T00:00:00Z", quick=True))
    write(tmp_path / "b.json", gpu_profile(measured_at="2026-11-20T00:00:00+05:00"))
    directory = ProfileDirectory(tmp_path)
    directory.refresh()
    assert [p.quick for p in directory.profiles] == [True]


def test_ceilings_join_profile_and_catalog() -> None:
    catalog = builtin_catalog()
    profile = gpu_profile()
    h100 = ceilings_for(H100, catalog, [profile])
    assert h100 is not None
    assert dict(h100.calibrated_flops)["bf16"] == 7.92e14
    assert "int8" not in dict(h100.calibrated_flops)
    assert h100.calibrated_memory_bandwidth == 3.1e12
    assert h100.calibrated_host_to_device == 5.3e10
    assert h100.calibrated_launch_latency_seconds == 6.0e-6
    assert dict(h100.datasheet_flops)["bf16"] == pytest.approx(989.4e12)
    assert h100.datasheet_memory_bandwidth == 3.35e12
    assert h100.price_usd_per_hour == 6.88

    l4 = ceilings_for(L4, catalog, [profile])
    assert l4 is not None
    assert l4.calibrated_flops == ()
    assert l4.calibrated_memory_bandwidth is None
    assert l4.price_usd_per_hour == 0.805

    assert ceilings_for("Quantum GPU 9000", catalog, [profile]) is None
    unknown = replace(profile, model="Quantum GPU 9000", catalog_key=None)
    found = ceilings_for("Quantum GPU 9000", catalog, [unknown])
    assert found is not None
    assert found.datasheet_flops == ()
    assert dict(found.calibrated_flops)["fp32"] == 5.1e13


def test_a_profile_matches_by_catalog_model_when_the_names_differ() -> None:
    # e.g. torch and NVML spelling the model differently; both resolve to the catalog's h100-sxm
    profile = gpu_profile(model="H100 SXM")
    ceilings = ceilings_for(H100, builtin_catalog(), [profile])
    assert ceilings is not None
    assert ceilings.calibrated_memory_bandwidth == 3.1e12


def test_ceilings_source_reports_the_collector_only_when_configured(tmp_path: Path) -> None:
    without = CeilingsSource(builtin_catalog(), None)
    ceilings, status = without.refresh([H100, L4, ""])
    assert status is None
    assert [c.model for c in ceilings] == [H100, L4]
    write(tmp_path / "h100.json", gpu_profile())
    source = CeilingsSource(builtin_catalog(), tmp_path)
    ceilings, status = source.refresh([H100])
    assert status is not None
    assert (status.name, status.success) == ("calibration", True)
    assert dict(ceilings[0].calibrated_flops)["bf16"] == 7.92e14
    again, _ = source.refresh([H100])
    assert again is ceilings, "nothing changed: the same ceilings, not recomputed"
