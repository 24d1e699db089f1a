"""dcgm-exporter's counters file, read the way dcgm-exporter reads it: which DCGM fields to serve.

The format is dcgm-exporter's `default-counters.csv`: one field a line as `DCGM field, Prometheus
type, help`, each part trimmed of spaces, a part in double quotes when it holds a comma; lines
starting with `#` are comments and blank lines are skipped. `gpuscope serve --compat.dcgm-counters
FILE` takes such a file (its settings row is in `exporter.config`); which of the listed fields
gpuscope can serve is decided above, in `exporter.metrics.dcgm`.

The file is read bounded (`COUNTERS_LIMIT`) and strictly: anything that is not a row of three
parts, a type dcgm-exporter does not know, a field listed twice or a file listing no field at all
is one line naming the file and the line, `counters.csv:4: expected 3 parts …`.
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
