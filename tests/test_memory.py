"""What keeps the daemon and the report server small that is not a benchmark figure: the malloc
arenas they ask glibc for, and the freed memory they hand back."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import pytest

from exporter import malloc

pytestmark = pytest.mark.timeout(30)


GLIBC = platform.libc_ver()[0] == "glibc"


def test_the_daemon_asks_glibc_for_two_malloc_arenas_unless_told_otherwise() -> None:
    assert malloc.fewer_arenas({"MALLOC_ARENA_MAX": "8"}) is False, "the environment wins"
    assert malloc.fewer_arenas({}) is GLIBC


def test_trim_hands_freed_pages_back() -> None:
    """Many small blocks freed in the middle of the heap stay resident until trimmed (glibc
    returns only the heap's top by itself)."""
    if not GLIBC:
        assert malloc.trim() is False
        return
    blocks = [ctypes.create_string_buffer(4000) for _ in range(50_000)]  # ~200 MB, each malloc'd
    keep = blocks[-1]  # holds the heap's top: only trimming can return what lies below it
    del blocks
    before = _resident()
    assert malloc.trim() is True
    assert _resident() < before - 100 * 2**20, "malloc_trim returned the freed pages"
    del keep


def _resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
