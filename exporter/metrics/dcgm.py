"""dcgm-exporter's series, from the same snapshot (`gpuscope serve --compat.dcgm`).

Each chosen field (`exporter.dcgm`: dcgm-exporter's defaults, or the rows of a counters file) is
one family named as dcgm-exporter names it, with its type and help, and its labels: `gpu`,
`UUID`, `pci_bus_id`, `device` (`nvidia<minor number>`), `modelName`, the node's name (`Hostname`;
`hostname` under `--compat.dcgm-version=4.9`), the driver-version label when that field is chosen
(`DCGM_FI_DRIVER_VERSION`; 4.9: `DCGM_FI_SYSTEM_DRIVER_VERSION`), `GPU_I_PROFILE` and `GPU_I_ID` on
a MIG instance (whose `gpu`, `UUID` and `device` are its parent's), and `namespace`, `pod`,
`container`. Both versions read the same series and split a shared GPU the same way.

Who a series belongs to follows the snapshot's attribution:

- a GPU (or MIG instance) that one container alone holds or uses, with no process outside pods:
  every series carries that container's pod labels, as dcgm-exporter's do;
- a GPU several containers hold or use (time-slicing, MPS), or one container and processes
  outside any pod: the fields a per-process measure can split (`Field.split`) get one series per
  container, its share of the device's value, and one series without pod labels for the share
  no container accounts for, so that the series of a GPU always add up to the device's value and
  summing by pod never counts a device twice. A container's share is its processes'
  utilization (or memory) over the device's, or over the containers' sum where that is larger
  (MPS clients overlap). Every other field is served once, for the device, without pod labels:
  a temperature or a clock is never copied onto several pods;
- a GPU nobody holds or uses: series without pod labels.

"Without pod labels" is spelled `namespace="",pod="",container=""`: Prometheus stores an empty
label as absent, and with `honorLabels: true` the empty labels keep the scrape target's own
(`pod` = the gpuscope pod) off the series, so `{container!=""}` selects only series that belong to
a container.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Final

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.metrics.exposition import PlainCounter
from exporter.metrics.labels import CACHE_LIMIT, LabelCache
from exporter.readings.events import XID_FAMILY

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from exporter.config import ServeConfig
    from exporter.dcgm import DcgmVersion, Field, Split
    from exporter.dcgm_counters import CountersFile
    from exporter.model import (
        Attribution,
        GpuIdentity,
        GpuSample,
        PodIdentity,
        PodUsage,
        Snapshot,
        Unattributed,
    )
    from exporter.series import Series

log = logging.getLogger(__name__)

Holder = tuple["PodIdentity", str]
"""A container that holds or uses a GPU: its pod and its name."""
_NOBODY: Final = ("", "", "")
_DECIMALS: Final = 6
"""dcgm-exporter prints DCGM's floating-point values with six decimals (and integers whole)."""


class DcgmCompat:
    """What `--compat.dcgm` serves: the chosen fields, the node's name, and the XID each GPU
    reported last (the only state: counted across renders, under a lock).

    `exporter.dcgm`'s declarations are imported when one is made (the sampling loop imports this
    module always, and makes one under `--compat.dcgm` only)."""

    def __init__(
        self,
        fields: Iterable[Field],
        *,
        hostname: str,
        helps: Mapping[str, str] | None = None,
        version: DcgmVersion | None = None,
    ) -> None:
        from exporter.dcgm import SPLIT_BY, VERSION_48, xid_message  # noqa: PLC0415

        self.version: Final = version or VERSION_48
        """Whose names and labels: dcgm-exporter 4.8's (the default) or 4.9's."""
        self._xid_message: Final = xid_message
        self._split_by: Final = SPLIT_BY
        chosen = tuple(fields)
        self.fields: Final = tuple(field for field in chosen if field.kind != "label")
        """The fields served as families, in the order chosen."""
        self.hostname: Final = hostname
        self._helps = {field.name: (helps or {}).get(field.name) or field.help for field in chosen}
        self._driver_label = any(field.name == self.version.driver_version for field in chosen)
        self._labels: LabelCache[tuple[GpuIdentity, PodIdentity | None, str]] = LabelCache(
            self._pairs
        )
        self._last_xid = _LastXid()

    @classmethod
    def from_config(cls, config: ServeConfig) -> DcgmCompat | None:
        """None unless `--compat.dcgm` is on. With a counters file, logs each row it cannot
        serve (once, here at start)."""
        if not config.compat_dcgm:
            return None
        from exporter.dcgm import VERSIONS  # noqa: PLC0415 - see the class

        version = VERSIONS[config.dcgm_version]
        hostname = config.node_name or socket.gethostname()
        if config.dcgm_counters is None:
            return cls(version.default_fields, hostname=hostname, version=version)
        return cls.from_counters(config.dcgm_counters, hostname=hostname, version=version)

    @classmethod
    def from_counters(
        cls, counters: CountersFile, *, hostname: str, version: DcgmVersion | None = None
    ) -> DcgmCompat:
        """The rows of a counters file that `version` serves (a name the other version spells
        was refused with the configuration, `exporter.dcgm_counters.version_mismatch`)."""
        from exporter.dcgm import VERSION_48  # noqa: PLC0415 - see the class

        version = version or VERSION_48
        by_name = version.by_name
        chosen: list[Field] = []
        helps: dict[str, str] = {}
        for row in counters.rows:
            field = by_name.get(row.field)
            if field is None:
                log.warning(
                    "the DCGM counters file lists a field gpuscope does not serve; ignoring it",
                    extra={
                        "field": row.field,
                        "at": counters.where(row),
                        "why": version.not_served.get(row.field, "not a field gpuscope knows"),
                    },
                )
                continue
            if row.kind != field.kind:
                log.info(
                    "the DCGM counters file gives a field another type; served with dcgm-exporter's",
                    extra={
                        "field": row.field,
                        "at": counters.where(row),
                        "given": row.kind,
                        "served": field.kind,
                    },
                )
            chosen.append(field)
            helps[field.name] = row.help
        return cls(chosen, hostname=hostname, helps=helps, version=version)

    def families(self, snapshot: Snapshot) -> list[Metric]:
        """One family per chosen field, for every GPU of the snapshot."""
        metrics = [(field, self._metric(field)) for field in self.fields]
        holders, uses, strays = _who_uses(snapshot.attribution)
        events = any(status.name == "events" for status in snapshot.collectors)
        for sample in snapshot.gpus:
            identity = sample.identity
            rows = holders.get(identity.uuid, ())
            stray = strays.get(identity.uuid)
            alone = rows[0] if len(rows) == 1 and not (stray and stray.processes) else None
            nobody = self._labels((identity, None, ""))
            owner = self._labels((identity, *alone)) if alone is not None else nobody
            device, own = nobody.base, owner.base
            shares: dict[Split, tuple[list[float], float]] = {}
            for field, metric in metrics:
                if not sample.up and not field.while_down:
                    continue
                if field.name == self.version.xid_errors:
                    if events and not identity.is_mig_instance:
                        xid = self._last_xid(identity.uuid, sample.values)
                        error = owner.with_pairs(
                            ("err_code", str(xid)), ("err_msg", self._xid_message(xid))
                        )
                        metric.samples.append(Sample(metric.name, error, float(xid)))
                    continue
                value = field.value(sample.values, gpm=identity.has_gpm)
                if value is None:
                    continue
                if field.split is None or alone is not None or not rows:
                    metric.samples.append(Sample(metric.name, own, round(value, _DECIMALS)))
                    continue
                split = shares.get(field.split)
                if split is None:
                    split = shares[field.split] = _shares(
                        field.split, sample, rows, uses, stray, measure=self._split_by[field.split]
                    )
                weights, whole = split
                scale = value / whole if whole > 0.0 else 0.0
                for (pod, container), weight in zip(rows, weights, strict=True):
                    holder = self._labels((identity, pod, container)).base
                    metric.samples.append(
                        Sample(metric.name, holder, round(weight * scale, _DECIMALS))
                    )
                left = (whole - sum(weights)) * scale if whole > 0.0 else value
                metric.samples.append(Sample(metric.name, device, round(max(left, 0.0), _DECIMALS)))
        return [metric for _, metric in metrics]

    def _metric(self, field: Field) -> Metric:
        help_text = self._helps[field.name]
        if field.kind == "counter":
            return PlainCounter(field.name, help_text)
        return Metric(field.name, help_text, "gauge")

    def _pairs(self, key: tuple[GpuIdentity, PodIdentity | None, str]) -> list[tuple[str, str]]:
        identity, pod, container = key
        minor = identity.minor_number if identity.minor_number is not None else identity.index
        pairs = [
            ("gpu", str(identity.index)),
            ("UUID", identity.parent_uuid or identity.uuid),
            ("pci_bus_id", identity.pci_bus_id),
            ("device", f"nvidia{minor}"),
            ("modelName", identity.model),
            (self.version.node_label, self.hostname),
        ]
        if self._driver_label:
            pairs.append((self.version.driver_version, identity.driver_version))
        if identity.is_mig_instance:
            pairs += [
                ("GPU_I_PROFILE", identity.mig_profile),
                ("GPU_I_ID", str(identity.gpu_instance)),
            ]
        namespace, name, container = (
            (pod.namespace, pod.name, container) if pod is not None else _NOBODY
        )
        return [*pairs, ("namespace", namespace), ("pod", name), ("container", container)]


Key = tuple[str, str, str]
"""(GPU UUID, pod UID, container)"""


def _who_uses(
    attribution: Attribution | None,
) -> tuple[dict[str, tuple[Holder, ...]], dict[Key, PodUsage], dict[str, Unattributed]]:
    """By GPU UUID: the containers that hold or use it (in the attribution's order), their use,
    and the processes on it outside any pod."""
    if attribution is None:
        return {}, {}, {}
    found: dict[str, dict[tuple[str, str], Holder]] = {}
    uses: dict[Key, PodUsage] = {}
    for use in attribution.usage:
        found.setdefault(use.gpu.uuid, {})[use.pod.uid, use.container] = (use.pod, use.container)
        uses[use.gpu.uuid, use.pod.uid, use.container] = use
    for held in attribution.allocations:
        rows = found.setdefault(held.gpu.uuid, {})
        rows.setdefault((held.pod.uid, held.container), (held.pod, held.container))
    holders = {uuid: tuple(rows.values()) for uuid, rows in found.items()}
    strays = {stray.gpu.uuid: stray for stray in attribution.unattributed}
    return holders, uses, strays


def _shares(
    split: Split,
    sample: GpuSample,
    rows: Sequence[Holder],
    uses: Mapping[Key, PodUsage],
    stray: Unattributed | None,
    *,
    measure: Series,
) -> tuple[list[float], float]:
    """Each holder's measure (its processes' utilization or memory) and the whole they are
    shares of: the device's measure, or the holders' sum (with the memory of processes outside
    pods) where that is larger, as MPS clients' utilizations can be. A holder's part of a field
    is the field's value times its measure over the whole; the series without pod labels gets
    what the holders leave. `measure` is the device's series of the split (`SPLIT_BY`)."""
    uuid = sample.identity.uuid
    weights: list[float] = []
    for pod, container in rows:
        use = uses.get((uuid, pod.uid, container))
        if use is None:
            weights.append(0.0)
        elif split == "utilization":
            weights.append(use.utilization or 0.0)
        else:
            weights.append(float(use.memory_used_bytes or 0))
    outside = float(stray.memory_used_bytes) if split == "memory" and stray is not None else 0.0
    whole = max(sample.values.get(measure) or 0.0, sum(weights) + outside)
    return weights, whole


class _LastXid:
    """The XID each GPU reported last. The snapshot counts XIDs per value; the one whose count
    rose since the last render is the last one (of several at once, the one counted more, then
    the higher). Renders of different snapshots may run in different threads, in any order: the
    counts kept only ever go up, so an older snapshot rendered late changes nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[dict[int, float], int]] = {}

    def __call__(self, uuid: str, values: Mapping[Series, float]) -> int:
        counts = {
            int(series.labels[0][1]): count
            for series, count in values.items()
            if series.family is XID_FAMILY
        }
        with self._lock:
            before, last = self._seen.get(uuid, ({}, 0))
            risen = {
                xid: n - before.get(xid, 0.0)
                for xid, n in counts.items()
                if n > before.get(xid, 0.0)
            }
            if risen:
                last = max(risen, key=lambda xid: (risen[xid], xid))
                if len(self._seen) >= CACHE_LIMIT:
                    self._seen.clear()
                self._seen[uuid] = ({**before, **{xid: counts[xid] for xid in risen}}, last)
            return last
