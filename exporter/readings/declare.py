"""How a reading is declared, and the register every declaration goes into.

A `Reading` is one driver call per GPU and the series it fills: each `Output` a series and the
conversion of the driver's answer to base units. The group modules of this package declare with
three functions, each putting what it makes into `DECLARED`:

- `family(...)`: a family a GPU's values fill (written by `exporter.metrics`, documented in the
  metrics reference); the same arguments as `Family`;
- `plain(...)`: a plain reading in one declaration — the driver call, its family (one series, no
  labels of its own), the conversion, how it is read, the simulator's answer; returns the series;
- `reading(...)`: a reading whose answer fills several series (a struct's members, a bitmask's
  bits, one series per label value); returns the reading. `fallback(...)` makes the reading of an
  older function that stands in for it (`fallback=`).

A reading belongs to the collector of the families it fills. The register refuses, where it is
declared, what would otherwise shadow another declaration without a word: a family or a reading
name given twice, a series whose family was not declared, two readings of one driver function
with the same arguments (the simulator answers each function and arguments from its own
declaration), two readings of one field, and readings of one function that disagree on whether it
takes a fan or link index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from exporter.catalog import ARCHITECTURES
from exporter.series import Family, Kind, Series

if TYPE_CHECKING:
    from collections.abc import Iterator

Convert = Callable[[Any], float | None]
"""The driver's answer -> a value in base units, or None where the answer has none."""
Args = tuple[object, ...]

HEALTH_PERIOD_SECONDS: Final = 5.0
"""How often health counters and states that change rarely are read (every cycle when the
collect interval is longer)."""


@dataclass(frozen=True, slots=True)
class Output:
    """One series a reading fills, and how to get its value from the driver's answer."""

    series: Series
    value: Convert


@dataclass(frozen=True, slots=True, eq=False)
class Reading:
    """One driver call per GPU per cycle, and the series it fills."""

    name: str
    """Short and stable: log lines and the "stop asking" bookkeeping use it."""
    call: str
    """The driver function (pynvml's name); called as `call(handle, *args)`."""
    outputs: tuple[Output, ...]
    args: Args = ()
    since: str = "kepler"
    """The oldest architecture that has it (the simulator answers NotSupported before)."""
    collector: str = "device"
    """Which `--collector.<name>` reads it."""
    mig: bool = False
    """Also read on each MIG instance (else on whole GPUs only)."""
    once: bool = False
    """Read once per NVML initialisation (a fact that does not change, such as a peak clock)."""
    period: float | None = None
    """Read at most this often (in seconds): counters and states that change rarely."""
    per: str | None = None
    """`fan`: read once per fan of the GPU; `link`: once per NVLink link that was active when
    NVML initialised. The index is the first argument after the handle (a field value's
    `scopeId`) and a label of the outputs' series (`fan` or `link`): the outputs are templates,
    `each(series, per, index)` the series one index fills."""
    field: int | None = None
    """A field value (`NVML_FI_DEV_*`; `call` is then `nvmlDeviceGetFieldValues`). A GPU's field
    values are read together, in one call, and each answers alone: a field the GPU lacks drops
    only its series. Read on whole GPUs, every cycle while one of the fields read has no
    `period` (else as often as the shortest)."""
    fallback: Reading | None = None
    """Read instead where this one is unavailable (an older function of an older driver)."""
    simulated: Callable[..., Any] | None = None
    """The simulator's answer to this call with these arguments, in the driver's own form
    (milliwatts, a struct, a bitmask), from a `SimulatedGpu`: `simulated(gpu)`, with the MIG
    instance's place in the GPU's layout after `gpu` for a `mig` reading (None for the whole
    GPU), then the fan or link for a per-fan or per-link one. It may raise pynvml's errors, as
    the driver does."""

    def __post_init__(self) -> None:
        if self.since not in ARCHITECTURES:
            raise ValueError(f"{self.name}: unknown architecture {self.since!r}")
        if self.per not in (None, "fan", "link"):
            raise ValueError(f"{self.name}: per {self.per!r} is not fan or link")
        if self.per is not None and (self.fallback is not None or self.once):
            raise ValueError(
                f"{self.name}: a per-{self.per} reading has no fallback and is not read once"
            )
        if self.field is not None and (
            self.call != "nvmlDeviceGetFieldValues"
            or self.per == "fan"
            or self.args
            or self.once
            or self.mig
            or self.fallback is not None
        ):
            raise ValueError(
                f"{self.name}: a field value is called as nvmlDeviceGetFieldValues, with no "
                "arguments, not once, on whole GPUs, per GPU or per link, without a fallback"
            )

    def chain(self) -> Iterator[Reading]:
        """This reading and its fallbacks, in the order they are tried."""
        current: Reading | None = self
        while current is not None:
            yield current
            current = current.fallback


class Declarations:
    """The families and readings declared so far, in declaration order; each declaration is
    checked against the others as it comes in (`ValueError`, one line naming both)."""

    def __init__(self) -> None:
        self.families: list[Family] = []
        self.readings: list[Reading] = []
        """The readings the sampler makes (their fallbacks are reached through them)."""
        self.calls: dict[str, dict[Args, Reading]] = {}
        """Driver function -> its readings (fallbacks included), by their arguments."""
        self.fields: dict[int, Reading] = {}
        """Field id -> its reading."""
        self._names: dict[str, Reading] = {}
        self._family_names: set[str] = set()

    def family(self, family: Family) -> Family:
        if family.name in self._family_names:
            raise ValueError(f"family {family.name} is declared twice")
        self._family_names.add(family.name)
        self.families.append(family)
        return family

    def reading(self, reading: Reading) -> Reading:
        chain = tuple(reading.chain())
        for position, made in enumerate(chain):
            self._check(made, earlier=chain[:position])
        for made in chain:
            self._names[made.name] = made
            if made.field is not None:
                self.fields[made.field] = made
            else:
                self.calls.setdefault(made.call, {})[made.args] = made
        self.readings.append(reading)
        return reading

    def _check(self, reading: Reading, *, earlier: tuple[Reading, ...]) -> None:
        """Against what is declared and the readings before it in its own fallback chain."""
        name = reading.name
        if name in self._names or any(other.name == name for other in earlier):
            raise ValueError(f"reading {name!r} is declared twice")
        for output in reading.outputs:
            if output.series.family not in self.families:
                raise ValueError(
                    f"reading {name!r}: family {output.series.family.name} is not declared "
                    "(declare it with family(...))"
                )
        if reading.field is not None:
            fields = {
                **self.fields,
                **{other.field: other for other in earlier if other.field is not None},
            }
            other = fields.get(reading.field)
            if other is not None:
                raise ValueError(
                    f"reading {name!r}: field {reading.field} is already read by {other.name!r}"
                )
            return
        declared = {
            **self.calls.get(reading.call, {}),
            **{other.args: other for other in earlier if other.call == reading.call},
        }
        other = declared.get(reading.args)
        if other is not None:
            raise ValueError(
                f"reading {name!r}: {reading.call}{_shown(reading.args)} is already read by "
                f"{other.name!r} (one reading per driver function and arguments)"
            )
        for other in declared.values():
            if other.per != reading.per:
                raise ValueError(
                    f"reading {name!r}: {reading.call} is read per {reading.per or 'GPU'} here "
                    f"and per {other.per or 'GPU'} by {other.name!r}"
                )


def _shown(args: Args) -> str:
    return f"({', '.join(repr(arg) for arg in args)})"


DECLARED: Final = Declarations()
"""This package's declarations: each group module adds its own as it is imported, and
`exporter.readings` imports every group before anything reads them. Nothing declares after
that, so every thread reads them as they stand (immutable once the package is imported)."""


def family(
    name: str,
    help_text: str,
    *,
    collector: str,
    kind: Kind = "gauge",
    unit: str = "",
    labels: tuple[str, ...] = (),
    doc: str = "",
    labels_doc: str = "",
    while_down: bool = False,
) -> Family:
    """A family a GPU's values fill, declared (`Family` has the fields' meanings)."""
    return DECLARED.family(
        Family(
            name,
            help_text,
            kind=kind,
            unit=unit,
            labels=labels,
            doc=doc,
            labels_doc=labels_doc,
            collector=collector,
            while_down=while_down,
        )
    )


def plain(
    name: str,
    call: str,
    filled: Family,
    convert: Convert,
    *,
    args: Args = (),
    since: str = "kepler",
    mig: bool = False,
    once: bool = False,
    period: float | None = None,
    per: str | None = None,
    field: int | None = None,
    simulated: Callable[..., Any] | None = None,
) -> Series:
    """A plain reading, declared: one call (`Reading` has the arguments' meanings) filling the
    one series of `filled` with `convert(answer)`. Returns that series."""
    if filled.labels != ((per,) if per is not None else ()):
        raise ValueError(
            f"reading {name!r}: {filled.name} has labels {filled.labels}: a plain reading fills "
            "one series (the fan or link label aside); declare labelled series with reading()"
        )
    series = Series(filled)
    reading(
        name,
        call,
        (Output(series, convert),),
        args=args,
        since=since,
        mig=mig,
        once=once,
        period=period,
        per=per,
        field=field,
        simulated=simulated,
    )
    return series


def reading(
    name: str,
    call: str,
    outputs: tuple[Output, ...],
    *,
    args: Args = (),
    since: str = "kepler",
    mig: bool = False,
    once: bool = False,
    period: float | None = None,
    per: str | None = None,
    field: int | None = None,
    fallback: Reading | None = None,
    simulated: Callable[..., Any] | None = None,
) -> Reading:
    """A reading filling several series, declared (`Reading` has the arguments' meanings)."""
    return DECLARED.reading(
        Reading(
            name,
            call,
            outputs,
            args=args,
            since=since,
            collector=_collector(name, outputs),
            mig=mig,
            once=once,
            period=period,
            per=per,
            field=field,
            fallback=fallback,
            simulated=simulated,
        )
    )


def fallback(
    name: str,
    call: str,
    outputs: tuple[Output, ...],
    *,
    args: Args = (),
    mig: bool = False,
    simulated: Callable[..., Any] | None = None,
) -> Reading:
    """The reading of an older function, read where the newer one is unavailable: declared by
    the reading it stands in for (`fallback=`), never read on its own."""
    collector = _collector(name, outputs)
    return Reading(
        name, call, outputs, args=args, collector=collector, mig=mig, simulated=simulated
    )


def _collector(name: str, outputs: tuple[Output, ...]) -> str:
    collectors = sorted({output.series.family.collector for output in outputs})
    if len(collectors) != 1:
        raise ValueError(f"reading {name!r}: its series belong to collectors {collectors}")
    return collectors[0]


@cache
def each(template: Series, per: str, index: int) -> Series:
    """The series fan or link `index` fills, from a per-fan or per-link reading's template (made
    once per index: series are compared by identity)."""
    return Series(template.family, ((per, str(index)), *template.labels))


def link_series(template: Series, link: int) -> Series:
    """A per-link template's series for NVLink link `link`."""
    return each(template, "link", link)
