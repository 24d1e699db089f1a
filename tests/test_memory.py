"""What keeps the daemon small that is not a benchmark figure: the malloc arenas it asks glibc for."""

from __future__ import annotations

import platform

import pytest

from exporter.cli import fewer_malloc_arenas

pytestmark = pytest.mark.timeout(30)


def test_the_daemon_asks_glibc_for_two_malloc_arenas_unless_told_otherwise() -> None:
    assert fewer_malloc_arenas({"MALLOC_ARENA_MAX": "8"}) is False, "the environment wins"
    asked = fewer_malloc_arenas({})
    assert asked is (platform.libc_ver()[0] == "glibc")
