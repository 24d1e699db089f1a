"""What a careless operator or an attacker can hand `gpuscope serve` at start: every hostile
settings input ends in one line on standard error and exit status 2, within seconds, in bounded
memory (the hardening issue's defects 2, 3, 5, 7 and 10 as they reached the daemon)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from tests.helpers import daemon_command, run_measured
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

EXIT_WITHIN = 15.0
MAX_RSS = 120 * 2**20
"""The daemon's imports cost about 50 MiB; a refused input must add nothing like its size
(the alias bomb once reached 4.19 GB, /dev/urandom 2.4 GB, a 50 MB value 300 MB)."""


def refused(*args: str) -> str:
    """Run `gpuscope serve --simulate 1 ARGS`; it must exit 2 with one line, at once, small.
    The line, without the program's prefix."""
    result = run_measured(
        daemon_command("--simulate=1", "--web.listen-address=127.0.0.1:0", *args),
        timeout=EXIT_WITHIN,
    )
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1, lines
    assert len(lines[0]) < 600, lines[0][:600]
    assert result.peak_rss_bytes < MAX_RSS, f"{result.peak_rss_bytes / 2**20:.0f} MiB"
    return lines[0].removeprefix("gpuscope: error: ")


def test_an_alias_bomb_as_config_file(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yml"
    bomb.write_text(alias_bomb())
    assert refused(f"--config.file={bomb}") == (
        f"invalid --config.file: {bomb}: expands to more than 100,000 values (aliases repeated?)"
    )


def test_an_endless_config_file() -> None:
    assert refused("--config.file=/dev/urandom") == (
        "invalid --config.file: /dev/urandom: not a regular file (a character device)"
    )


def test_a_fifo_as_config_file(tmp_path: Path) -> None:
    """Read as a file, a FIFO blocks the daemon's start until something writes to it."""
    fifo = tmp_path / "config.yml"
    os.mkfifo(fifo)
    assert refused(f"--config.file={fifo}") == (
        f"invalid --config.file: {fifo}: not a regular file (a FIFO)"
    )


def test_a_binary_config_file(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yml"
    binary.write_bytes(bytes(range(128, 256)) * 8)
    assert refused(f"--config.file={binary}") == (
        f"invalid --config.file: {binary}: not UTF-8 text (byte 0 is 0x80)"
    )


def test_an_oversized_value_is_cut_in_the_message(tmp_path: Path) -> None:
    big = tmp_path / "big.yml"
    big.write_text("kubelet:\n  resource-names: " + "a" * 900_000 + "\n")
    line = refused(f"--config.file={big}")
    assert line.startswith(f"invalid kubelet.resource-names in {big}: 'aaaa")
    assert "(900,000 characters) is not a resource name" in line
    huge = tmp_path / "huge.yml"
    huge.write_text("kubelet:\n  resource-names: " + "a" * 50_000_000 + "\n")
    assert refused(f"--config.file={huge}") == (
        f"invalid --config.file: {huge}: larger than 1 MiB (the limit)"
    )


def test_a_key_given_twice(tmp_path: Path) -> None:
    twice = tmp_path / "twice.yml"
    twice.write_text("collect:\n  interval: 1s\ncollect:\n  interval: 5s\n")
    assert refused(f"--config.file={twice}") == (
        f"invalid --config.file: {twice}: key 'collect' appears twice in one mapping (line 3)"
    )


def test_a_label_pattern_that_backtracks_for_ever() -> None:
    assert refused("--kubernetes.pod-labels=(a+)+$") == (
        "invalid --kubernetes.pod-labels: '(a+)+$' is refused: a repetition inside a repetition "
        "can make matching one long label name take minutes or more"
    )


def test_a_binary_fleet_file(tmp_path: Path) -> None:
    binary = tmp_path / "fleet.yml"
    binary.write_bytes(b"gpus:\n  - model: \xff\xfe\n")
    line = refused(f"--simulate={binary}")
    assert line.endswith("not UTF-8 text (byte 17 is 0xff)"), line
