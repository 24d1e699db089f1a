"""The sharing policies `gpuscope rightsize --simulate` replays, and the setting's parser."""

from __future__ import annotations

from typing import Final

from exporter.documents import quote
from exporter.settings import text

CURRENT: Final = "current"
EXCLUSIVE: Final = "exclusive"
MIG: Final = "mig"
TIMESLICE: Final = "timeslice"
BINPACK: Final = "binpack"
POLICIES: Final = (CURRENT, EXCLUSIVE, MIG, TIMESLICE, BINPACK)
"""Every policy, in the order a report lists them."""
SERVING_KINDS: Final = frozenset({"Deployment", "StatefulSet"})
"""The workloads `timeslice` co-locates: services, which run all the time at a varying load."""


def parse_policies(values: object) -> tuple[str, ...]:
    """`current,exclusive,...` (repeated or comma-separated) -> the policies, in `POLICIES`'
    order, each once; an unknown one is named."""
    listed = values if isinstance(values, list) else [values]
    wanted: set[str] = set()
    for value in listed:
        for name in text(value).split(","):
            spelled = name.strip().lower()
            if not spelled:
                continue
            if spelled not in POLICIES:
                raise ValueError(f"unknown policy {quote(spelled)}: one of {', '.join(POLICIES)}")
            wanted.add(spelled)
    if not wanted:
        raise ValueError(f"expected policies, comma-separated: {', '.join(POLICIES)}")
    return tuple(policy for policy in POLICIES if policy in wanted)
