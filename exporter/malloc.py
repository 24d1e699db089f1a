"""glibc's allocator, tuned for long-running Python processes with a few threads: fewer arenas,
and the memory a large piece of work freed handed back to the system.

Both are calls into the C library through ctypes; on a C library without them (musl, say) they
do nothing and say so."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

M_ARENA_MAX: Final = -8
"""glibc's mallopt() parameter for the number of malloc arenas."""
MALLOC_ARENAS: Final = 2


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def fewer_arenas(environ: Mapping[str, str]) -> bool:
    """Ask glibc for `MALLOC_ARENAS` malloc arenas: it gives each thread that allocates an arena
    of its own (up to 8 per core) and keeps the pages each arena ever held, which with a thread
    per GPU costs 1-2 MiB resident for nothing (the GIL serialises Python's allocations anyway).
    Called before any thread starts; `MALLOC_ARENA_MAX` in the environment, set by whoever runs
    the process, wins; a C library without mallopt() is left alone. Whether it was asked."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, MALLOC_ARENAS))


def trim() -> bool:
    """Hand the pages freed in every arena back to the system (glibc's malloc_trim): after a
    piece of work that allocated hundreds of MB and let them go, which glibc otherwise keeps
    resident for the next. Blocking (ctypes releases the GIL meanwhile); whether it was asked."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True
