"""dcgm-exporter's counters file, read the way dcgm-exporter reads it: which DCGM fields to serve.

The format is dcgm-exporter's `default-counters.csv`: one field a line as `DCGM field, Prometheus
type, help`, each part trimmed of spaces, a part in double quotes when it holds a comma; lines
starting with `#` are comments and blank lines are skipped. `gpuscope serve --compat.dcgm-counters
FILE` takes such a file (its settings row is in `exporter.config`); which of the listed fields
gpuscope can serve is decided above, in `exporter.metrics.dcgm`.

The file is read bounded (`COUNTERS_LIMIT`) and strictly: anything that is not a row of three
parts, a type dcgm-exporter does not know, a field listed twice or a file listing no field at all
is one line naming the file and the line, `counters.csv:4: expected 3 parts …`.

A file is read for one dcgm-exporter version (`--compat.dcgm-version`): 4.9.0 renamed 22 default
fields and the driver-version label (`RENAMED_IN_49`). A name the other version spells is refused
(`version_mismatch`) rather than mapped: under 4.9 the renamed fields also change unit, so a
file written for 4.8 would silently serve other numbers under the names its queries do not use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.documents import Invalid, decode, quote, read_bounded

if TYPE_CHECKING:
    from pathlib import Path

COUNTERS_LIMIT: Final = 256 * 1024
"""dcgm-exporter's own default file is 5 KiB, every DCGM field listed would be about 40 KiB."""
TYPES: Final = ("gauge", "counter", "histogram", "summary", "label")
"""The types dcgm-exporter accepts in the second column (`label` makes a field a label)."""
_FIELD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DCGM_VERSIONS: Final = ("4.8", "4.9")
"""The dcgm-exporter versions whose shapes `--compat.dcgm` serves (4.8: 4.8.0 to 4.8.4)."""
RENAMED_IN_49: Final = {
    "DCGM_FI_DEV_SM_CLOCK": "DCGM_FI_DEV_SM_CLOCK_HERTZ",
    "DCGM_FI_DEV_MEM_CLOCK": "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "DCGM_FI_DEV_MEMORY_COPY_UTIL_RATIO",
    "DCGM_FI_DEV_ENC_UTIL": "DCGM_FI_DEV_ENC_UTIL_RATIO",
    "DCGM_FI_DEV_DEC_UTIL": "DCGM_FI_DEV_DEC_UTIL_RATIO",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_FB_FREE": "DCGM_FI_DEV_FB_FREE_BYTES",
    "DCGM_FI_DEV_FB_USED": "DCGM_FI_DEV_FB_USED_BYTES",
    "DCGM_FI_DEV_FB_RESERVED": "DCGM_FI_DEV_FB_RESERVED_BYTES",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
}
"""dcgm-exporter 4.8's name → 4.9.0's, for the 23 default rows (22 fields and the driver-version
label) that DCGM 4.7 deprecates. 4.9.0's own file could not be read: the names are its release
notes' and DCGM 4.6's header's, four (`*_COPY/ENC/DEC_UTIL_RATIO`, `DCGM_FI_DEV_FB_*_BYTES`)
inferred from DCGM's naming standard (docs/guide/dcgm.md says which)."""
ADDED_IN_49: Final = {"DCGM_FI_DEV_FB_CAPACITY_BYTES": "DCGM_FI_DEV_FB_TOTAL"}
"""4.9.0's new default field → the field 4.8 serves the same reading as (in its own unit)."""


@dataclass(frozen=True, slots=True)
class CounterRow:
    """One field the file lists: its name, the type and help it gives, and its line."""

    field: str
    kind: str
    help: str
    line: int


@dataclass(frozen=True, slots=True)
class CountersFile:
    path: str
    rows: tuple[CounterRow, ...]

    def where(self, row: CounterRow) -> str:
        """`file:line` of a row, for log lines."""
        return f"{self.path}:{row.line}"


def read_counters(path: Path) -> CountersFile:
    """The rows of a counters file; `ValueError` with one line (`file:line: problem`) if it
    cannot be used."""
    try:
        text = decode(read_bounded(path, COUNTERS_LIMIT))
    except Invalid as error:
        raise ValueError(f"{path}: {error.problem}") from None
    rows: list[CounterRow] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            row = _row(line, number)
        except Invalid as error:
            raise ValueError(f"{path}:{number}: {error.problem}") from None
        if row.field in seen:
            raise ValueError(
                f"{path}:{number}: {row.field} is listed twice (first on line {seen[row.field]})"
            )
        seen[row.field] = number
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: lists no DCGM field (lines of: DCGM field, type, help)")
    return CountersFile(str(path), tuple(rows))


def version_mismatch(counters: CountersFile, version: str) -> str | None:
    """`file:line: problem` for the first row naming a field as the other dcgm-exporter version
    spells it, or None."""
    if version == "4.9":
        theirs: dict[str, str] = dict(RENAMED_IN_49)
        hint = "--compat.dcgm-version=4.8"
    else:
        theirs = {new: old for old, new in RENAMED_IN_49.items()} | ADDED_IN_49
        hint = "--compat.dcgm-version=4.9"
    other = "4.9" if version == "4.8" else "4.8"
    for row in counters.rows:
        ours = theirs.get(row.field)
        if ours is not None:
            return (
                f"{counters.where(row)}: {row.field} is dcgm-exporter {other}'s name; {version} "
                f"serves it as {ours} (rename the row, or serve {other} with {hint})"
            )
    return None


def _row(line: str, number: int) -> CounterRow:
    # csv is imported only to read a counters file: `exporter.config` imports this module always.
    import csv  # noqa: PLC0415 - see above

    try:
        (parts,) = csv.reader([line], strict=True, skipinitialspace=True)
    except csv.Error as error:
        raise Invalid("", f"not a CSV row ({error})") from None
    parts = [part.strip() for part in parts]
    if len(parts) != 3:
        raise Invalid(
            "", f"expected 3 parts (DCGM field, Prometheus type, help), found {len(parts)}"
        )
    field, kind, help_text = parts
    if not _FIELD.fullmatch(field):
        raise Invalid("", f"{quote(field)} is not a DCGM field name (DCGM_FI_DEV_GPU_UTIL, …)")
    if kind not in TYPES:
        raise Invalid("", f"{quote(kind)} is not a type dcgm-exporter knows ({', '.join(TYPES)})")
    return CounterRow(field, kind, help_text, number)
