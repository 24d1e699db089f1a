"""One GPU's state between cycles, and how every driver call for it is made: failing alone.

A `Device` is one GPU (or MIG instance) as of the current NVML initialisation, with what it keeps
between cycles (its integrals, its field-value request, …); a physical GPU's state is touched by
its job (and that job's follow-up read) only, or by the sampler while neither runs. `Reads`
makes each call and sorts its failures:
- a function this GPU or driver lacks (`NotSupported`, `FunctionNotFound`) drops that series and
  is not asked again until NVML is re-initialised (logged once);
- any other NVML error drops the value for this cycle (logged once per cause) and marks the
  reading's collector failed for this cycle;
- anything else (a bug, an answer gpuscope does not understand) drops the value too, is counted
  and logged once with its traceback at debug level;
- a lifecycle error (`GPU_IS_LOST`, ...) escapes as `GpuLost`: the GPU is down until NVML
  re-initialises.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import pynvml

from exporter.nvml.driver import error_code, error_name, is_lifecycle_error, is_unavailable

if TYPE_CHECKING:
    import struct
    from collections.abc import Callable, Iterator

    from exporter.logs import LogOnce
    from exporter.model import GpuIdentity, GpuSample
    from exporter.nvml.gpm import GpmReader
    from exporter.nvml.workers import GpuWorker, Ticket
    from exporter.readings.declare import Convert, Reading
    from exporter.series import Series

log = logging.getLogger(__name__)

T = TypeVar("T")


class GpuLost(Exception):
    """A lifecycle error from one GPU's handle: stop reading it this cycle."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Counter:
    """A count several threads add to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def add(self) -> None:
        with self._lock:
            self._value += 1

    @property
    def value(self) -> int:
        with self._lock:
            return self._value


@dataclass(slots=True)
class Integrals:
    """One physical GPU's integrated counters; they outlive re-initialisations."""

    busy_seconds: float = 0.0
    last_read: float | None = None
    """When utilization was last read (None: integrate from the next reading on)."""
    activity_seconds: dict[str, list[float]] = field(default_factory=dict)
    """GPU or MIG instance uuid -> integrated [sm, tensor, dram] activity."""


@dataclass(slots=True)
class Tally:
    """What each collector's readings did in one GPU's read this cycle."""

    failed: set[str] = field(default_factory=set)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Time spent in each collector's readings (added to with `+=`: no call in the loop every
    GPU runs every cycle)."""

    def clear(self) -> None:
        self.failed.clear()
        self.seconds.clear()


@dataclass(frozen=True, slots=True)
class FieldSlot:
    """One field asked for: which reading (and link) it is, and the series its value fills."""

    what: str
    """The reading's name, with the link for a per-link one (its own unavailability)."""
    reading: Reading
    outputs: tuple[tuple[Series, Callable[[Any], float | None]], ...]


@dataclass(frozen=True, slots=True)
class FieldRequest:
    """What one GPU asks `nvmlDeviceGetFieldValues` each cycle (`exporter.nvml.fields` makes it
    and reads the answers; it is kept on the `Device` until a field drops out)."""

    ids: tuple[tuple[int, int], ...]
    """(field id, scope id) per field, as pynvml takes them."""
    slots: tuple[FieldSlot, ...]
    """What each answer is, in the same order."""
    collectors: tuple[str, ...]
    """The collectors with a field in it: the call counts towards each."""
    series: tuple[Series, ...]
    """The one series each field fills, in the same order (empty unless `factors` is given)."""
    factors: tuple[float, ...] | None
    """Where every field fills one series with its number multiplied (`convert.Times`, or
    `number`: times 1), the factor of each; then a GPU's answers are converted all at once."""


@dataclass(frozen=True, slots=True)
class Call:
    """A reading made every cycle, as one GPU makes it: the driver function, its arguments (the
    handle first) and each output's series and conversion, looked up once."""

    reading: Reading
    function: Callable[..., Any]
    args: tuple[Any, ...]
    outputs: tuple[tuple[Series, Convert], ...]


PlanGroup: TypeAlias = "tuple[str, tuple[Call, ...], tuple[Reading, ...], tuple[Reading, ...]]"
"""One collector's plain readings in a GPU's plan: its name; the readings made every cycle, as
`Call`s; those made every cycle per fan or link; those made once or on a slow clock (the last two
made through their declarations)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A GPU's plain readings, collector by collector, as of the readings it had refused when it
    was made (`exporter.nvml.device` makes it again when it refuses one more)."""

    groups: object
    """The declarations it was made from (a whole GPU's, or a MIG instance's)."""
    refused: int
    """How many readings the GPU had refused."""
    steps: tuple[PlanGroup, ...]


@dataclass(slots=True)
class Device:
    """One GPU or MIG instance as of the current NVML initialisation."""

    handle: Any
    identity: GpuIdentity
    fan_count: int = 0
    links: tuple[int, ...] = ()
    """The NVLink links active when NVML initialised (none on a GPU without NVLink)."""
    integrals: Integrals = field(default_factory=Integrals)
    tally: Tally = field(default_factory=Tally)
    """Shared by a GPU and its MIG instances: they are read in one job."""
    unavailable: set[str] = field(default_factory=set)
    """Readings this GPU or driver cannot give: not asked again until re-initialisation."""
    lost: bool = False
    once: dict[Series, float] = field(default_factory=dict)
    """Values of the readings made once per initialisation."""
    done_once: set[str] = field(default_factory=set)
    periodic: dict[str, tuple[float, dict[Series, float]]] = field(default_factory=dict)
    """Reading name -> (when it is due again, its last values), for readings on a slow clock."""
    slow: dict[str, tuple[float, dict[Series, float]]] = field(default_factory=dict)
    """Collector -> (when the first of its readings made once or on a slow clock is due, the
    values they all gave last): a cycle with none due repeats them in one step. Emptied with
    each new plan."""
    process_timestamp_us: int = 0
    """Newest per-process utilization sample seen; asked for only newer ones next time."""
    process_names: dict[int, str] = field(default_factory=dict)
    """The names of the processes last listed, by pid (with `--collect.process-names`)."""
    fields: FieldRequest | None = None
    """Its field values' request, made on first use and again when a field drops out."""
    field_layout: tuple[FieldRequest, tuple[int, ...], struct.Struct] | None = None
    """The request its answers last all succeeded for, their value types, and how answers of
    those types are read, each number as its type (`exporter.nvml.fields`)."""
    plan: Plan | None = None
    """Its plain readings' plan, made on first use and again when a reading drops out."""
    gpm: GpmReader | None = None
    """GPM samples of this GPU or MIG instance, where the GPU has GPM."""
    mig_slots: int = 0
    """How many MIG devices this GPU can hold (0 unless MIG mode is on)."""
    mig: dict[str, Device] = field(default_factory=dict)
    """MIG instances seen in the last cycle, by UUID."""
    pcie: tuple[float, float, float] | None = None
    """(transmit, receive bytes/s, when measured) from the worker's last PCIe window."""
    pcie_status: tuple[bool, float] | None = None
    """Whether that window's reading failed, and how long it took (reported with the next job)."""
    worker: GpuWorker[Device] | None = None
    """The thread this physical GPU is read in now (None for a MIG instance): shared with the
    other GPUs while it answers fast."""
    ticket: Ticket[Any] | None = None
    """Its last job's answer, owed while not `answered` (`exporter.nvml.workers`)."""
    taken: Ticket[Any] | None = None
    """The last answered ticket the sampler has read: a job that answers after its cycle's wait
    is read at the next cycle, so that a GPU slower than the wait reports its newest answer."""
    answer: tuple[GpuSample, ...] | None = None
    """The last samples its worker delivered (the GPU and its MIG instances)."""

    def gpm_readers(self) -> Iterator[GpmReader]:
        for device in (self, *self.mig.values()):
            if device.gpm is not None:
                yield device.gpm


class Reads:
    """Driver calls that fail alone, shared by every GPU's worker (its state is thread-safe)."""

    def __init__(self, once: LogOnce, errors: Counter) -> None:
        self._once = once
        self._errors = errors

    def call(
        self,
        device: Device,
        what: str,
        collector: str,
        function: Callable[..., T],
        *args: Any,
        log_as: str | None = None,
    ) -> T | None:
        """One reading; None when this GPU cannot give it now. Lifecycle errors escape."""
        if what in device.unavailable:
            return None
        try:
            return function(*args)
        except Exception as error:  # noqa: BLE001 - each reading fails alone, whatever broke it
            self.failed(device, what, collector, error, log_as=log_as)
            return None

    def failed(
        self,
        device: Device,
        what: str,
        collector: str,
        error: Exception,
        *,
        log_as: str | None = None,
    ) -> None:
        """Log (once) why a reading failed; raises `GpuLost` for a lifecycle error. `what` is
        the reading's bookkeeping name (one per fan or link of a per-fan or per-link reading),
        `log_as` the name logged, once for all of them (the reading's)."""
        identity = device.identity
        if is_lifecycle_error(error):
            raise GpuLost(error) from error
        reading = log_as or what
        fields: dict[str, object] = {
            "gpu": identity.index,
            "uuid": identity.uuid,
            "reading": reading,
            "error": error_name(error),
        }
        if is_unavailable(error):
            device.unavailable.add(what)
            self._once(
                logging.INFO,
                ("field", identity.uuid, reading),
                "not available on this GPU or driver; its series is omitted",
                fields=fields,
            )
            return
        device.tally.failed.add(collector)
        if isinstance(error, pynvml.NVMLError):
            self._once(
                logging.WARNING,
                ("field", identity.uuid, reading, error_code(error)),
                "NVML reading failed; its series is omitted while it fails",
                fields=fields,
            )
            return
        self._errors.add()
        self._once.unexpected(
            ("field", identity.uuid, reading),
            "unexpected error reading NVML; its series is omitted while it fails",
            error,
            fields={"gpu": identity.index, "uuid": identity.uuid, "reading": reading},
        )
