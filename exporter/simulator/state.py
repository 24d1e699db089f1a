"""One simulated GPU's physical state (`GpuState`), advanced lazily to the time it is asked
about, and the handles the simulated driver gives out for a GPU and a MIG device.

Physics in brief: each process demands a share of its GPU (`behaviour.demand`); time-slicing caps
the sum at 100%; power follows load with a 1.5 s lag, temperature follows power with a 40 s lag; a
poorly cooled GPU under sustained load heats past its slowdown threshold and the clocks drop, as a
real one's do. GPM counters integrate the activity of the running work (`activity`), MIG instances
carve a GPU into slices with processes of their own, and time spent power-capped, hot or idle
accumulates in the violation counters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import pynvml

from exporter.catalog import ARCHITECTURES
from exporter.simulator import activity
from exporter.simulator.behaviour import demand, lag, noise, running

if TYPE_CHECKING:
    from exporter.catalog import GpuModel, MigProfile
    from exporter.simulator.fleet import Fault, SimGpu, SimProcess

_RESERVED_BYTES: Final = 523 * 2**20
MPS_SERVER_BYTES: Final = 310 * 2**20
_POWER_LAG_SECONDS: Final = 1.5
_THERMAL_LAG_SECONDS: Final = 40.0
_AMBIENT_CELSIUS: Final = 30.0
_HOT_RISE_CELSIUS: Final = {"normal": 45.0, "poor": 66.0}
_SW_THERMAL_CELSIUS: Final = 87.0
_HW_THERMAL_CELSIUS: Final = 92.0
NOT_AVAILABLE: Final = 0xFFFFFFFF
"""NVML's value for an id that does not apply (a process or an event outside any MIG instance)."""
STATE_QUANTUM_SECONDS: Final = 0.01
"""Readings within this much time of each other see the same state (one sampling pass)."""


@dataclass(slots=True)
class GpuState:
    """The simulated physical state of one GPU, advanced lazily to the time it is asked about."""

    gpu: SimGpu
    processes: tuple[SimProcess, ...]
    seed: int
    t: float | None = None
    power_watts: float = 0.0
    temperature: float = _AMBIENT_CELSIUS
    energy_millijoules: float = 0.0
    utilization: float = 0.0
    memory_utilization: float = 0.0
    shares: dict[int, float] = field(default_factory=dict)
    """pid -> share of the GPU each running process had at time t."""
    power_capped: bool = False
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    ecc_applied: set[int] = field(default_factory=set)
    layout_faults: tuple[Fault, ...] = ()
    """`mig_layout` faults of this GPU, in time order."""
    layout: tuple[MigProfile, ...] | None = None
    """The MIG instances at time t (None: MIG mode off)."""
    instance_uuids: tuple[str, ...] = ()
    rates: list[float] = field(default_factory=lambda: [0.0] * activity.SIZE)
    """Activity rates of the whole GPU at time t (see `activity`)."""
    instance_rates: dict[str, list[float]] = field(default_factory=dict)
    activity_total: list[float] = field(default_factory=lambda: [0.0] * activity.SIZE)
    """The rates integrated since start: what a GPM sample captures."""
    instance_activity: dict[str, list[float]] = field(default_factory=dict)
    violation_ns: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    """Perf policy -> nanoseconds the clocks were held down for it."""
    nvlink_links: int = 0
    """Its NVLink links, all up (0: a GPU without NVLink)."""
    nvlink_bytes: tuple[float, float] = (0.0, 0.0)
    """Bytes sent and received over all its links so far (`activity_total`'s NVLink part, kept
    apart as it is integrated: every link's field value reads it, 36 a GPU each cycle)."""
    architecture: int = field(init=False)
    """Its architecture's place in `ARCHITECTURES` (what a reading's `since` is held against)."""

    def __post_init__(self) -> None:
        self.architecture = ARCHITECTURES.index(self.gpu.model.architecture)

    def advance(self, t: float, ecc_faults: list[Fault]) -> None:
        if self.t is not None and t - self.t < STATE_QUANTUM_SECONDS:
            return
        model = self.gpu.model
        self._set_layout(t)
        self._share_out(t)
        load = 0.8 * self.utilization + 0.2 * self.memory_utilization
        target = model.idle_watts + (model.tdp_watts - model.idle_watts) * 1.08 * load
        self.power_capped = target > model.tdp_watts
        target = min(target, model.tdp_watts)
        hot = _AMBIENT_CELSIUS + _HOT_RISE_CELSIUS[self.gpu.cooling] * target / model.tdp_watts
        if self.t is None:
            # Start in equilibrium, as a GPU that has been running for a while would be.
            self.power_watts = target
            self.temperature = hot
            uptime_hours = 1 + noise(self.seed, self.gpu.index, 0xE) * 47
            self.energy_millijoules = model.idle_watts * uptime_hours * 3600 * 1000
        else:
            elapsed = t - self.t
            before = self.power_watts
            self.power_watts = lag(before, target, elapsed, _POWER_LAG_SECONDS)
            self.energy_millijoules += (before + self.power_watts) / 2 * elapsed * 1000
            self.temperature = lag(self.temperature, hot, elapsed, _THERMAL_LAG_SECONDS)
        for number, fault in enumerate(ecc_faults):
            if number not in self.ecc_applied and fault.at <= t:
                self.ecc_applied.add(number)
                self.ecc_corrected += fault.corrected
                self.ecc_uncorrected += fault.uncorrected
        if self.t is not None:
            self._integrate(t - self.t)
        self.t = t

    def _set_layout(self, t: float) -> None:
        layout = self.gpu.mig
        for fault in self.layout_faults:
            if fault.at <= t:
                layout = fault.mig
        if self.t is not None and layout == self.layout:
            return
        self.layout = layout
        self.instance_uuids = tuple(
            activity.mig_uuid(self.seed, self.gpu.index, position, profile.profile)
            for position, profile in enumerate(layout or ())
        )
        # An instance that stays keeps its counters; a new one starts from zero.
        self.instance_activity = {
            uuid: self.instance_activity.get(uuid, [0.0] * activity.SIZE)
            for uuid in self.instance_uuids
        }

    def _share_out(self, t: float) -> None:
        """Who gets how much of the GPU (or of each MIG instance) at time t."""
        layout = self.layout
        groups: dict[int | None, list[SimProcess]] = defaultdict(list)
        for process in self.processes:
            slot = process.mig_instance
            placed = slot is None if layout is None else slot is not None and slot < len(layout)
            if placed and running(process, t):
                groups[slot].append(process)
        self.shares = {}
        self.instance_rates = {}
        utilization = memory_utilization = 0.0
        whole = [0.0] * activity.SIZE
        for slot, members in groups.items():
            demands = {p.pid: demand(p, self.seed, t) for p in members}
            total = sum(demands.values())
            scale = 1.0 / total if total > 1.0 else 1.0
            shares = {pid: d * scale for pid, d in demands.items()}
            self.shares.update(shares)
            rates = activity.rates((p, shares[p.pid]) for p in members)
            if layout is None or slot is None:
                utilization = min(total, 1.0)
                memory_utilization = rates[3]
                whole = rates
                continue
            weight = layout[slot].compute_slices / 7
            self.instance_rates[self.instance_uuids[slot]] = rates
            utilization += weight * min(total, 1.0)
            memory_utilization += weight * rates[3]
            for n, rate in enumerate(rates):
                whole[n] += rate * weight if n < activity.RATIOS else rate
        self.utilization = min(utilization, 1.0)
        self.memory_utilization = min(memory_utilization, 1.0)
        if not self.nvlink_links:
            whole[activity.NVLINK_TX] = whole[activity.NVLINK_RX] = 0.0  # nothing to send it over
        self.rates = whole

    def _integrate(self, elapsed: float) -> None:
        for n, rate in enumerate(self.rates):
            self.activity_total[n] += rate * elapsed
        total = self.activity_total
        self.nvlink_bytes = total[activity.NVLINK_TX], total[activity.NVLINK_RX]
        for uuid, rates in self.instance_rates.items():
            totals = self.instance_activity[uuid]
            for n, rate in enumerate(rates):
                totals[n] += rate * elapsed
        nanoseconds = elapsed * 1e9
        held = False
        for policy, holds in (
            (pynvml.NVML_PERF_POLICY_POWER, self.power_capped),
            (pynvml.NVML_PERF_POLICY_THERMAL, self.temperature >= _SW_THERMAL_CELSIUS),
            (pynvml.NVML_PERF_POLICY_LOW_UTILIZATION, self.utilization < 0.01),
        ):
            if holds:
                self.violation_ns[policy] += nanoseconds
                held = True
        if held:
            self.violation_ns[pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS] += nanoseconds
        if self.temperature >= _HW_THERMAL_CELSIUS:
            self.violation_ns[pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS] += nanoseconds

    # -- what the declarations' simulated answers read (`readings.simulated.SimulatedGpu`) -----

    @property
    def model(self) -> GpuModel:
        return self.gpu.model

    @property
    def mig_configured(self) -> bool:
        return self.gpu.mig is not None

    @property
    def mig_active(self) -> bool:
        return self.layout is not None

    @property
    def working(self) -> bool:
        return bool(self.shares)

    def memory(self, position: int | None) -> tuple[int, int, int]:
        if position is not None:
            total, used = self.instance_memory(position)
            return total, 0, used
        used = sum(p.memory_bytes for p in self.processes if p.pid in self.shares) + (
            MPS_SERVER_BYTES if self.gpu.sharing == "mps" and self.shares else 0
        )
        return self.gpu.model.nvml_memory_bytes, _RESERVED_BYTES, used

    def instance_position(self, uuid: str) -> int | None:
        return self.instance_uuids.index(uuid) if uuid in self.instance_uuids else None

    def instance_memory(self, position: int) -> tuple[int, int]:
        """(total, used) bytes of the MIG instance in `position`."""
        assert self.layout is not None
        used = sum(
            p.memory_bytes
            for p in self.processes
            if p.mig_instance == position and p.pid in self.shares
        )
        return self.layout[position].memory_bytes, used

    def clock_events(self) -> int:
        reasons = 0
        if self.utilization < 0.01:
            reasons |= pynvml.nvmlClocksEventReasonGpuIdle
        if self.power_capped:
            reasons |= pynvml.nvmlClocksEventReasonSwPowerCap
        if self.temperature >= _SW_THERMAL_CELSIUS:
            reasons |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
        if self.temperature >= _HW_THERMAL_CELSIUS:
            reasons |= pynvml.nvmlClocksEventReasonHwThermalSlowdown
        return reasons

    def clock_mhz(self, kind: str) -> int:
        peak = self.gpu.model.max_clocks_hz.get(kind, 0.0) / 1e6
        if kind == "memory":
            return round(peak if self.shares else peak * 0.25)
        if self.utilization < 0.01:
            return round(min(peak, 345.0))
        factor = 1.0
        if self.power_capped:
            factor = 0.9
        if self.temperature >= _SW_THERMAL_CELSIUS:
            factor = min(factor, 0.8)
        if self.temperature >= _HW_THERMAL_CELSIUS:
            factor = 0.55
        return round(peak * factor)


@dataclass(frozen=True, slots=True)
class Handle:
    device: GpuState
    obtained_at: float
    """Simulated time the handle was handed out: a GPU lost before then stays lost for it."""


@dataclass(frozen=True, slots=True)
class MigHandle:
    """A MIG device: valid while its instance exists (a layout change destroys it)."""

    parent: Handle
    uuid: str
