"""Cutting a replay part-way: the report server's shutdown, or its refresh's deadline.

The replay is pure computation in the refresh thread, where no `asyncio` timeout can reach it:
it asks its `Cut` between policies and every few hundred items of a placement pass, and stops
there by raising `ReplayCut`. A `threading.Event` is the one thing the event loop and the
refresh thread share here; setting it is their only exchange (the event is thread-safe).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Final


class ReplayCut(Exception):
    """The replay stopped before its end: nothing it computed is kept."""


@dataclass(frozen=True, slots=True)
class Cut:
    """When a replay must stop: once `stop` is set, or past `deadline` (monotonic seconds)."""

    stop: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None

    def check(self) -> None:
        """Raise `ReplayCut` if the replay must stop now."""
        if self.stop.is_set():
            raise ReplayCut("the replay was cut: the server is stopping")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ReplayCut("the replay was cut: the refresh's deadline passed")


NEVER: Final = Cut()
"""A replay nothing cuts (a one-off `gpuscope rightsize` run: Ctrl-C interrupts it anyway)."""
