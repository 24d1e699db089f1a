"""The daemon's side of calibration: profiles from a file or directory, re-read only on change,
joined with the catalog into the `Ceilings` of every GPU model present.

Runs in the sampler's worker thread. Each cycle costs a directory scan and one `stat` per profile
file; files are read and parsed only when that changes. A Kubernetes ConfigMap mounted as a
directory shows each key as a symlink through `..data`, which the kubelet swaps atomically on an
update: `stat` follows the symlinks, so the swap is seen as changed files. Hidden entries (the
`..data` machinery) and files that are not `.json`, `.yaml` or `.yml` are ignored.

A profile is read through `exporter.calibration.parse.load_profile`: at most 1 MiB (what a
ConfigMap holds), bounded and strict (`exporter.documents`). One that cannot be read or parsed —
an alias bomb, binary bytes, a key given twice, a file too large — is rejected with one log line
(again only once it changes and is still bad); the other profiles keep working, and
`gpuscope_collector_success{collector="calibration"}` is 0 while any is rejected.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from datetime import datetime
from typing import TYPE_CHECKING, Final

from exporter.calibration.profile import Figure, Profile, ProfileError, Result, format_for
from exporter.logs import LogOnce
from exporter.model import Ceilings, CollectorStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from exporter.catalog import Catalog

log = logging.getLogger(__name__)

COLLECTOR: Final = "calibration"
_MAX_FILES: Final = 1000
"""More files than this in the directory is a mistake (the wrong path), not a fleet of models."""

_FileSignature = tuple[str, int, int, int, int]
"""(name, device, inode, mtime in ns, size) of one profile file, symlinks followed."""


class ProfileDirectory:
    """The profiles under one path (a file or a directory), reloaded when the files change."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._once = LogOnce(log)
        self._signature: tuple[_FileSignature, ...] | str | None = None
        self._profiles: tuple[Profile, ...] = ()
        self._rejected = 0
        self._reported: set[_FileSignature] = set()
        """Rejected files already logged, as they were then: each is logged once per version."""
        self.generation = 0
        """Incremented whenever the set of loaded profiles may have changed."""

    @property
    def profiles(self) -> tuple[Profile, ...]:
        return self._profiles

    @property
    def healthy(self) -> bool:
        """True when the path was readable and no profile was rejected."""
        return not isinstance(self._signature, str) and self._rejected == 0

    def refresh(self) -> None:
        """Reload if anything under the path changed since the last call."""
        signature = self._scan()
        if signature == self._signature:
            return
        self._signature = signature
        self.generation += 1
        if isinstance(signature, str):
            self._profiles, self._rejected = (), 0
            self._once(
                logging.WARNING,
                ("path", signature),
                "calibration path unreadable; no calibrated series until it is back",
                fields={"path": str(self._path), "error": signature},
            )
            return
        self._once.forget_matching(("path",))
        self._load(signature)

    def _scan(self) -> tuple[_FileSignature, ...] | str:
        """The signature of every candidate file, or the reason the path cannot be read."""
        try:
            status = os.stat(self._path)
            if not stat.S_ISDIR(status.st_mode):
                return (_signature(self._path.name, status),)
            found = []
            with os.scandir(self._path) as entries:
                for entry in entries:
                    if entry.name.startswith(".") or format_for(entry.name) is None:
                        continue
                    try:
                        target = entry.stat()  # follows symlinks: ConfigMap keys are symlinks
                    except FileNotFoundError:
                        continue  # a dangling symlink: a key that is going away
                    # Special files are candidates too: reading one refuses it (not a regular
                    # file) with the rejected profile's warning, not in silence.
                    found.append(_signature(entry.name, target))
                    if len(found) > _MAX_FILES:
                        return f"more than {_MAX_FILES} profile files"
        except OSError as error:
            return error.strerror or type(error).__name__
        return tuple(sorted(found))

    def _load(self, signature: tuple[_FileSignature, ...]) -> None:
        # The profile reader is imported only with a --calibration.path (off in the chart's
        # default): a daemon without one keeps the datasheet ceilings alone.
        from exporter.calibration.parse import load_profile  # noqa: PLC0415 - see above

        loaded: list[tuple[str, Profile]] = []
        rejected: set[_FileSignature] = set()
        directory = self._path.is_dir()
        for stamp in signature:
            name = stamp[0]
            path = self._path / name if directory else self._path
            try:
                profile = load_profile(path, source=name)
            except ProfileError as error:
                rejected.add(stamp)
                if stamp not in self._reported:
                    log.warning(
                        "calibration profile rejected; its model keeps only datasheet series",
                        extra={"file": str(path), "error": str(error)},
                    )
                continue
            loaded.append((name, profile))
        self._reported = rejected
        self._rejected = len(rejected)
        self._profiles = _newest_per_model(loaded)
        log.info(
            "calibration profiles loaded",
            extra={
                "path": str(self._path),
                "models": ", ".join(profile.model for profile in self._profiles),
                "rejected": len(rejected),
            },
        )


def _signature(name: str, status: os.stat_result) -> _FileSignature:
    return (name, status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size)


def _newest_per_model(loaded: Iterable[tuple[str, Profile]]) -> tuple[Profile, ...]:
    """One profile per model: the most recent measurement (then the last file name) wins."""
    chosen: dict[str, tuple[datetime, str, Profile]] = {}
    for name, profile in loaded:
        candidate = (datetime.fromisoformat(profile.measured_at), name, profile)
        key = profile.model.lower()
        if key not in chosen or candidate[:2] > chosen[key][:2]:
            chosen[key] = candidate
    return tuple(entry[2] for _, entry in sorted(chosen.items()))


def ceilings_for(model: str, catalog: Catalog, profiles: Iterable[Profile]) -> Ceilings | None:
    """Everything known about one GPU model; None when neither catalog nor profile knows it."""
    entry = catalog.find(model)
    profile = _matching_profile(model, entry.key if entry else None, catalog, profiles)
    if entry is None and profile is None:
        return None
    price = catalog.price(entry) if entry is not None else None
    ceilings = Ceilings(
        model=model,
        datasheet_flops=tuple(sorted(entry.peak_flops.items())) if entry else (),
        datasheet_memory_bandwidth=entry.memory_bandwidth_bytes_per_second if entry else None,
        price_usd_per_hour=price.usd_per_hour if price is not None else None,
        mig_gpu_shares=tuple((p.profile, p.gpu_share) for p in entry.mig_profiles) if entry else (),
    )
    if profile is None:
        return ceilings
    return Ceilings(
        model=model,
        calibrated_flops=tuple(sorted(profile.calibrated_flops.items())),
        calibrated_memory_bandwidth=profile.memory_bandwidth,
        calibrated_host_to_device=_value(profile.host_to_device),
        calibrated_device_to_host=_value(profile.device_to_host),
        calibrated_launch_latency_seconds=_value(profile.launch_eager),
        datasheet_flops=ceilings.datasheet_flops,
        datasheet_memory_bandwidth=ceilings.datasheet_memory_bandwidth,
        price_usd_per_hour=ceilings.price_usd_per_hour,
        mig_gpu_shares=ceilings.mig_gpu_shares,
    )


def _matching_profile(
    model: str, catalog_key: str | None, catalog: Catalog, profiles: Iterable[Profile]
) -> Profile | None:
    """The profile measured on this model: same name, else the same catalog model."""
    candidates = list(profiles)
    for profile in candidates:
        if profile.model.lower() == model.lower():
            return profile
    if catalog_key is None:
        return None
    for profile in candidates:
        found = catalog.find(profile.model)
        if profile.catalog_key == catalog_key or (found is not None and found.key == catalog_key):
            return profile
    return None


def _value(result: Result) -> float | None:
    return result.value if isinstance(result, Figure) else None


class CeilingsSource:
    """Ceilings for the GPU models present, recomputed only when profiles or models change."""

    def __init__(
        self,
        catalog: Catalog,
        path: Path | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog = catalog
        self._directory = ProfileDirectory(path) if path is not None else None
        self._clock = clock
        self._cached: tuple[tuple[int, frozenset[str]], tuple[Ceilings, ...]] | None = None

    def refresh(self, models: Iterable[str]) -> tuple[tuple[Ceilings, ...], CollectorStatus | None]:
        """The ceilings of these models, and the calibration collector's status (None when no
        `--calibration.path` is set)."""
        started = self._clock()
        status = None
        generation = 0
        if self._directory is not None:
            self._directory.refresh()
            generation = self._directory.generation
        key = (generation, frozenset(filter(None, models)))
        if self._cached is None or self._cached[0] != key:
            profiles = self._directory.profiles if self._directory is not None else ()
            found = (ceilings_for(model, self._catalog, profiles) for model in sorted(key[1]))
            self._cached = (key, tuple(ceiling for ceiling in found if ceiling is not None))
        if self._directory is not None:
            status = CollectorStatus(COLLECTOR, self._directory.healthy, self._clock() - started)
        return self._cached[1], status
