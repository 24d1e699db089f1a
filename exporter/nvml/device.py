"""Reading one GPU: the job its worker runs each cycle, and the PCIe window after it.

The plain readings come from their declarations (`exporter.readings.READINGS`): one driver call
each (one per fan or NVLink link for a per-fan or per-link one), converted to base units, on the
GPU's own clock where the declaration asks (once per initialisation, or every few seconds); the
field-value readings together, in one call (`exporter.nvml.fields`). Around them: utilization
integrated into the busy counter, GPM activity and its integrated counters, throttle time, the
process list, and a GPU in MIG mode's instances. Only the collectors switched on are read
(`--collector.<name>`).

Everything here runs in the GPU's worker thread; `Answer` is what crosses back to the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.model import GpuSample, ProcessSample
from exporter.nvml.fields import read_fields, request
from exporter.nvml.health import read_throttle
from exporter.nvml.mig import enumerate_instances
from exporter.nvml.processes import read_processes
from exporter.nvml.reads import Call, Plan
from exporter.readings import READINGS
from exporter.readings.declare import HEALTH_PERIOD_SECONDS, each
from exporter.readings.device import BUSY, UTILIZATION
from exporter.readings.gpm import INTEGRATED_ACTIVITY
from exporter.readings.mig import MIG_MODE
from exporter.readings.pcie import PCIE_RECEIVE, PCIE_TRANSMIT

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device, PlanGroup, Reads
    from exporter.readings.declare import Reading
    from exporter.series import Series

GPU_COLLECTORS: Final = (
    "device",
    "clocks",
    "health",
    "processes",
    "gpm",
    "mig",
    "pcie",
    "nvlink",
)
"""Collectors read GPU by GPU (beside them: `events`, and the non-NVML sources)."""

_KIB: Final = 1024

_Groups = tuple[tuple[str, tuple["Reading", ...]], ...]
_NONE_MADE: Final[tuple[float, dict[Series, float]]] = (float("-inf"), {})
"""A collector's slow readings before their first cycle: due at once, nothing to repeat."""


def _slow_clock(reading: Reading) -> bool:
    """Made once per initialisation or on a slow clock, not every cycle."""
    return reading.once or reading.period is not None


def _by_collector(readings: list[Reading]) -> _Groups:
    """The readings grouped by collector, in `GPU_COLLECTORS`' order (any other after them),
    each group in declaration order."""
    groups: dict[str, list[Reading]] = {collector: [] for collector in GPU_COLLECTORS}
    for reading in readings:
        groups.setdefault(reading.collector, []).append(reading)
    return tuple((collector, tuple(group)) for collector, group in groups.items() if group)


@dataclass(frozen=True, slots=True)
class Answer:
    """One GPU's job: its samples (the GPU, then its MIG instances) and what each collector's
    readings did."""

    samples: tuple[GpuSample, ...]
    failed: frozenset[str]
    """Collectors a reading of which failed this cycle (not: was unsupported)."""
    seconds: tuple[float, ...]
    """Time spent in each collector's readings, in the reader's `collectors` order (0 for one
    that read nothing)."""


class DeviceReader:
    """What to read on every GPU, and how; shared by all the GPUs' workers (stateless itself)."""

    def __init__(
        self,
        nvml: NvmlDriver,
        reads: Reads,
        *,
        collectors: tuple[str, ...],
        processes: bool,
        process_names: bool = False,
        clock: Callable[[], float],
        interval: float,
    ) -> None:
        """`processes`: read process lists (for per-process series, or for pod attribution);
        `process_names`: and each listed process's name."""
        self._nvml = nvml
        self._reads = reads
        self._clock = clock
        self._collectors = frozenset(collectors)
        self.collectors = collectors
        """The collectors read, in the order of each `Answer.seconds`."""
        self._no_time = (0.0,) * len(collectors)
        readings = [r for r in READINGS if r.collector in collectors]
        self._groups = _by_collector([r for r in readings if r.field is None])
        """The plain readings to make, collector by collector (each group timed as one)."""
        self._fields = tuple(r for r in readings if r.field is not None)
        """The field-value readings, made together in one call."""
        self._fields_period = min((r.period or 0.0 for r in self._fields), default=0.0)
        """How often that call is made: every cycle (0) while one of its readings has no period
        (NVLink's traffic), else as often as the most frequent of them."""
        self._instance_groups = _by_collector([r for r in readings if r.mig])
        self._processes = processes
        self._process_names = process_names
        self._max_gap = max(2 * interval, 2.0)
        """Across a longer gap between readings nothing is known: counters do not integrate it."""
        self._pcie_max_age = max(3 * interval, 5.0)
        """A PCIe figure older than this is dropped rather than shown."""

    def enabled(self, collector: str) -> bool:
        return collector in self._collectors

    # -- the job -------------------------------------------------------------------------------

    def read(self, device: Device) -> Answer:
        """One physical GPU and its MIG instances. Lifecycle errors escape as `GpuLost`."""
        tally = device.tally
        tally.clear()
        now = self._clock()
        values = self._plain(device, self._groups, now)
        if self._fields:
            self._field_values(device, values, now)
        mig_enabled = values.get(MIG_MODE) == 1.0
        self._integrate_busy(device, values, now)
        self._activity(device, values, now)
        if "health" in self._collectors:
            started = self._clock()
            values.update(self._periodic(device, "throttle", now, self._throttle))
            tally.seconds["health"] += self._clock() - started
        # In MIG mode each process is listed on its instance, not twice.
        processes = self._processes_of(device) if not mig_enabled else None
        samples = [GpuSample(device.identity, up=True, values=values, processes=processes)]
        if mig_enabled and "mig" in self._collectors:
            started = self._clock()
            instances = enumerate_instances(
                self._nvml, self._reads, device, gpm="gpm" in self._collectors
            )
            tally.seconds["mig"] += self._clock() - started
            samples.extend(self._instance(instance, now) for instance in instances.values())
        if device.pcie_status is not None:
            failed, seconds = device.pcie_status
            tally.seconds["pcie"] += seconds
            if failed:
                tally.failed.add("pcie")
        return Answer(
            tuple(samples),
            frozenset(tally.failed),
            tuple(map(tally.seconds.get, self.collectors, self._no_time)),
        )

    def _instance(self, instance: Device, now: float) -> GpuSample:
        """What NVML gives per MIG instance: memory, processes and GPM activity; device-level
        utilization, power and heat belong to the parent GPU."""
        values = self._plain(instance, self._instance_groups, now)
        self._activity(instance, values, now)
        return GpuSample(
            instance.identity, up=True, values=values, processes=self._processes_of(instance)
        )

    def _processes_of(self, device: Device) -> tuple[ProcessSample, ...] | None:
        if not self._processes:
            return None
        started = self._clock()
        processes = read_processes(self._nvml, self._reads, device, names=self._process_names)
        device.tally.seconds["processes"] += self._clock() - started
        return processes

    # -- plain readings ------------------------------------------------------------------------

    def _plain(self, device: Device, groups: _Groups, now: float) -> dict[Series, float]:
        """Every plain reading, collector by collector, each collector's time counted. A reading
        made every cycle is one call of its `Call` (the loop every GPU runs every cycle, kept
        lean), a per-fan or per-link one goes through `_call`; those made once or on a slow
        clock come after them (`_slow`, when one of them is due)."""
        values: dict[Series, float] = {}
        clock = self._clock
        seconds = device.tally.seconds
        for collector, calls, per_index, slow in self._plan(device, groups):
            started = clock()
            for step in calls:
                try:
                    answer = step.function(*step.args)
                except Exception as error:  # noqa: BLE001 - each reading fails alone
                    self._refused(device, step.reading, error, values)
                    continue
                for series, convert in step.outputs:
                    value = convert(answer)
                    if value is not None:
                        values[series] = value
            for reading in per_index:
                self._call(device, reading, values)
            if slow:
                # Most cycles none of them is due: their last values repeated in one step.
                due, last = device.slow.get(collector, _NONE_MADE)
                if now < due:
                    values.update(last)
                else:
                    self._slow(device, collector, slow, now, values)
            seconds[collector] += clock() - started
        return values

    def _slow(
        self,
        device: Device,
        collector: str,
        readings: tuple[Reading, ...],
        now: float,
        values: dict[Series, float],
    ) -> None:
        """A collector's readings made once or on a slow clock, once one of them is due: each
        made when due, the others' last values repeated."""
        fresh: dict[Series, float] = {}
        next_due = float("inf")
        for reading in readings:
            if reading.once:
                self._once(device, reading, fresh)
                if reading.name not in device.done_once:
                    next_due = now  # it has not answered: asked again next cycle
            else:
                next_due = min(next_due, self._periodic_reading(device, reading, now, fresh))
        device.slow[collector] = (next_due, fresh)
        values.update(fresh)

    def _plan(self, device: Device, groups: _Groups) -> tuple[PlanGroup, ...]:
        """The GPU's plain readings as it makes them now: made again when it refuses one more
        (its fallback, or nothing, stands in from then on)."""
        plan = device.plan
        refused = len(device.unavailable)
        if plan is None or plan.groups is not groups or plan.refused != refused:
            steps = tuple(
                (
                    collector,
                    tuple(
                        call
                        for r in readings
                        if not _slow_clock(r) and r.per is None and (call := self._step(device, r))
                    ),
                    tuple(r for r in readings if not _slow_clock(r) and r.per is not None),
                    tuple(r for r in readings if _slow_clock(r)),
                )
                for collector, readings in groups
            )
            plan = device.plan = Plan(groups, refused, steps)
            device.slow.clear()
        return plan.steps

    def _step(self, device: Device, reading: Reading) -> Call | None:
        """A reading made every cycle as a `Call` of the first of its chain the GPU has not
        refused (None: it has refused them all)."""
        for made in reading.chain():
            if made.name not in device.unavailable:
                return Call(
                    made,
                    self._function(made.call),
                    (device.handle, *made.args),
                    tuple((output.series, output.value) for output in made.outputs),
                )
        return None

    def _refused(
        self, device: Device, reading: Reading, error: Exception, values: dict[Series, float]
    ) -> None:
        """A reading that failed: logged once (`GpuLost` escapes); where the GPU lacks it, its
        fallback is made at once (and stands in from the next cycle on)."""
        self._reads.failed(device, reading.name, reading.collector, error)
        if reading.fallback is not None and reading.name in device.unavailable:
            self._call(device, reading.fallback, values)

    def _periodic_reading(
        self, device: Device, reading: Reading, now: float, values: dict[Series, float]
    ) -> float:
        """A reading on a slow clock: made when due, its last values repeated in between. Returns
        when it is due next."""
        assert reading.period is not None
        last = device.periodic.get(reading.name)
        if last is None or now >= last[0]:
            fresh: dict[Series, float] = {}
            self._call(device, reading, fresh)
            last = device.periodic[reading.name] = (now + reading.period, fresh)
        values.update(last[1])
        return last[0]

    def _field_values(self, device: Device, values: dict[Series, float], now: float) -> None:
        """Every field-value reading in one call (on a slow clock when all of them are); its
        time counts towards each collector with a field in it."""
        started = self._clock()
        asked = device.fields
        if asked is None:
            asked = device.fields = request(self._fields, device)
        values.update(
            self._periodic(
                device,
                "fields",
                now,
                partial(read_fields, self._nvml, self._reads, asked=asked),
                self._fields_period,
            )
        )
        spent = self._clock() - started
        for collector in asked.collectors:
            device.tally.seconds[collector] += spent

    def _once(self, device: Device, reading: Reading, values: dict[Series, float]) -> None:
        """A reading made once per initialisation, and repeated from then on."""
        if reading.name not in device.done_once:
            self._call(device, reading, device.once)
            if reading.name not in device.unavailable:
                device.done_once.add(reading.name)
        for output in reading.outputs:
            value = device.once.get(output.series)
            if value is not None:
                values[output.series] = value

    def _periodic(
        self,
        device: Device,
        name: str,
        now: float,
        read: Callable[[Device], dict[Series, float]],
        period: float = HEALTH_PERIOD_SECONDS,
    ) -> dict[Series, float]:
        """Cumulative counters and states that change rarely, read every `period` and reported
        from the last reading in between: a slower clock costs them nothing."""
        due, last = device.periodic.get(name, (0.0, {}))
        if now < due:
            return last
        fresh = read(device)
        device.periodic[name] = (now + period, fresh)
        return fresh

    def _call(self, device: Device, reading: Reading, values: dict[Series, float]) -> None:
        """Make the reading (or its fallback, where the GPU lacks it) and store its outputs."""
        if reading.name in device.unavailable:
            if reading.fallback is not None:
                self._call(device, reading.fallback, values)
            return
        function = self._function(reading.call)
        handle = device.handle
        if reading.per is not None:
            self._call_each(device, reading, function, values)
            return
        answer = self._reads.call(
            device, reading.name, reading.collector, function, handle, *reading.args
        )
        if answer is None:
            if reading.fallback is not None and reading.name in device.unavailable:
                self._call(device, reading.fallback, values)
            return
        for output in reading.outputs:
            value = output.value(answer)
            if value is not None:
                values[output.series] = value

    def _call_each(
        self,
        device: Device,
        reading: Reading,
        function: Callable[..., Any],
        values: dict[Series, float],
    ) -> None:
        """A per-fan or per-link reading: once per fan or active link, its index the first
        argument after the handle; each fails alone, logged once for all of them."""
        per = reading.per
        assert per is not None
        name = reading.name
        handle = device.handle
        indices = device.links if per == "link" else range(device.fan_count)
        for index in indices:
            answer = self._reads.call(
                device,
                f"{name}{index}",
                reading.collector,
                function,
                handle,
                index,
                *reading.args,
                log_as=name,
            )
            if answer is None:
                continue
            for output in reading.outputs:
                value = output.value(answer)
                if value is not None:
                    values[each(output.series, per, index)] = value

    def _function(self, name: str) -> Callable[..., Any]:
        function: Callable[..., Any] = getattr(self._nvml, name)
        return function

    # -- derived and special readings ------------------------------------------------------------

    def _integrate_busy(self, device: Device, values: dict[Series, float], now: float) -> None:
        """Utilization integrated into the busy counter, the series behind rate()."""
        utilization = values.get(UTILIZATION)
        if utilization is None:
            return
        integrals = device.integrals
        previous = integrals.last_read
        # Across a gap (the GPU hung or could not be read) nothing is known: integrate from now.
        gap = now - previous if previous is not None else None
        elapsed = gap if gap is not None and gap <= self._max_gap else 0.0
        integrals.busy_seconds += utilization * elapsed
        integrals.last_read = now
        values[BUSY] = integrals.busy_seconds

    def _activity(self, device: Device, values: dict[Series, float], now: float) -> None:
        """GPM activity and its integrated counters; before Hopper, the PCIe throughput the
        worker measured after the previous reading."""
        pcie = "pcie" in self._collectors
        if device.gpm is None:
            measured = device.pcie
            if pcie and measured is not None and self._clock() - measured[2] <= self._pcie_max_age:
                values[PCIE_TRANSMIT] = measured[0]
                values[PCIE_RECEIVE] = measured[1]
            return
        started = self._clock()
        reading = self._reads.call(device, "gpm", "gpm", device.gpm.read, now)
        device.tally.seconds["gpm"] += self._clock() - started
        if reading is None:
            return
        gpm = reading.values
        values.update(gpm)
        if not pcie:
            values.pop(PCIE_TRANSMIT, None)
            values.pop(PCIE_RECEIVE, None)
        totals = device.integrals.activity_seconds.setdefault(device.identity.uuid, [0.0, 0.0, 0.0])
        for position, (ratio_series, counter_series) in enumerate(INTEGRATED_ACTIVITY):
            ratio = gpm.get(ratio_series)
            if ratio is not None:
                totals[position] += ratio * reading.window_seconds
                values[counter_series] = totals[position]

    def _throttle(self, device: Device) -> dict[Series, float]:
        return read_throttle(self._nvml, self._reads, device)

    def read_pcie(self, device: Device) -> None:
        """PCIe throughput over the driver's 20 ms window per direction: the worker's follow-up
        to a reading of a GPU without GPM, so the window never delays a cycle."""
        started = self._clock()
        read = self._function("nvmlDeviceGetPcieThroughput")
        handle = device.handle
        device.tally.failed.discard("pcie")
        try:
            transmit = self._reads.call(
                device, "pcie_throughput", "pcie", read, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
            )
            receive = self._reads.call(
                device, "pcie_throughput", "pcie", read, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES
            )
        except Exception:  # noqa: BLE001 - a lost GPU is the next reading's to report
            transmit = receive = None
        if transmit is not None and receive is not None:
            device.pcie = (transmit * _KIB, receive * _KIB, self._clock())
        device.pcie_status = ("pcie" in device.tally.failed, self._clock() - started)
