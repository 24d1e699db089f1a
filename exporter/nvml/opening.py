"""Opening the GPUs at an NVML initialisation, each in a thread of its own.

A GPU off the bus can hang the calls that enumerate it (its handle, UUID, name, links) as it
hangs any other call about it. Made one after another in the sampling thread, one such call held
up every GPU after it and, at start, the daemon itself, which never came to listen. So each GPU
is opened in a short-lived thread and the sampler waits for them all until one deadline; a GPU
whose opening has not returned by then is down (reason `hung`), its thread left in the driver
until the call returns — NVML is not shut down meanwhile (`NvmlSampler._all_idle`).

Threading rule: an `Opening`'s result is written by its thread only and read by the sampler only
once `join` has seen that thread end; one still running is never read again.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class Opening(Generic[T]):
    """One GPU's opening: its result or the exception it raised, once its thread has ended."""

    __slots__ = ("error", "index", "result", "thread")

    def __init__(self, index: int, probe: Callable[[int], T]) -> None:
        self.index = index
        self.result: T | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(probe,), name=f"gpuscope-open{index}", daemon=True
        )

    def _run(self, probe: Callable[[int], T]) -> None:
        try:
            self.result = probe(self.index)
        except BaseException as error:  # noqa: BLE001 - handed to the sampler, which decides
            self.error = error

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


def open_all(
    count: int, probe: Callable[[int], T], *, deadline: float, timer: Callable[[], float]
) -> list[Opening[T]]:
    """GPUs 0 to `count - 1`, each opened by `probe` in a thread of its own, waited for until
    `deadline` (on `timer`) in all; those still opening are returned not `done`."""
    openings = [Opening(index, probe) for index in range(count)]
    for opening in openings:
        opening.thread.start()
    for opening in openings:
        opening.thread.join(max(0.0, deadline - timer()))
    return openings
