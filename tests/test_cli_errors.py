"""What a user sees for a command line gpuscope refuses: the command's usage and one line naming
the nearest flag, and for a job whose extra is not installed, one line naming the extra."""

from __future__ import annotations

import sys
import tomllib
from typing import TYPE_CHECKING

import pytest

from exporter import extras
from exporter.cli import main
from tests.helpers import ROOT

if TYPE_CHECKING:
    from collections.abc import Sequence

pytestmark = pytest.mark.timeout(60)


def refused(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> list[str]:
    """The lines `gpuscope <argv>` prints on stderr, after checking it exits 2."""
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("argv", "command", "error"),
    [
        (
            ["serve", "--simualte", "4"],
            "gpuscope serve",
            "unrecognized arguments: --simualte 4 (did you mean --simulate?)",
        ),
        (
            ["serve", "--simulate=2", "--colect.interval=1s", "--no-collector.nvlnk"],
            "gpuscope serve",
            (
                "unrecognized arguments: --colect.interval=1s --no-collector.nvlnk "
                "(did you mean --collect.interval or --no-collector.nvlink?)"
            ),
        ),
        (
            ["calibrate", "--devcie", "cpu"],
            "gpuscope calibrate",
            "unrecognized arguments: --devcie cpu (did you mean --device?)",
        ),
        (
            ["rightsize", "--prometeus=http://127.0.0.1:1"],
            "gpuscope rightsize",
            "unrecognized arguments: --prometeus=http://127.0.0.1:1 (did you mean --prometheus?)",
        ),
        (
            ["rightsize", "serve", "--prometheus=http://127.0.0.1:1", "--refrsh=1h"],
            "gpuscope rightsize serve",
            "unrecognized arguments: --refrsh=1h (did you mean --refresh?)",
        ),
        (
            # The server serves every format; the nearest of its flags is the log's.
            ["rightsize", "serve", "--prometheus=http://127.0.0.1:1", "--format=json"],
            "gpuscope rightsize serve",
            "unrecognized arguments: --format=json (did you mean --log.format?)",
        ),
        (
            ["rightsize", "--prometheus=http://127.0.0.1:1", "--unknown-flag"],
            "gpuscope rightsize",
            "unrecognized arguments: --unknown-flag",
        ),
        (
            ["serve", "--zzz"],
            "gpuscope serve",
            "unrecognized arguments: --zzz",
        ),
    ],
)
def test_a_mistyped_flag_gets_the_commands_usage_and_the_nearest_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], command: str, error: str
) -> None:
    assert refused(capsys, argv) == [
        f"usage: {command} [FLAG ...]   ({command} --help lists them)",
        f"{command}: error: {error}",
    ]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["serve", "--sim", "4"], "--sim 4 (did you mean --simulate?)"),
        (["calibrate", "--dev", "cpu"], "--dev cpu (did you mean --device?)"),
    ],
)
def test_a_flag_is_spelled_whole(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    """An abbreviation would change meaning the day another flag starts the same way."""
    assert refused(capsys, argv)[-1].endswith(f"error: unrecognized arguments: {error}")


def test_a_bad_value_is_reported_by_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, ["serve", "--simulate"]) == [
        "usage: gpuscope serve [FLAG ...]   (gpuscope serve --help lists them)",
        "gpuscope serve: error: argument --simulate: expected one argument",
    ]


@pytest.mark.parametrize(
    ("argv", "extra", "missing"),
    [
        (["rightsize", "--prometheus=http://127.0.0.1:1"], "rightsize", "aiohttp, jinja2"),
        (["rightsize", "serve", "--prometheus=http://127.0.0.1:1"], "rightsize", "aiohttp, jinja2"),
        (["calibrate", "--device=cpu"], "calibrate", "torch"),
    ],
)
def test_a_job_without_its_extra_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    extra: str,
    missing: str,
) -> None:
    for module in missing.split(", "):
        monkeypatch.setitem(sys.modules, module, None)  # as in the core install
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"gpuscope {argv[0]}: error: needs gpuscope[{extra}] ({missing} not installed): "
        f"pip install 'gpuscope[{extra}]'\n"
    )


def test_the_extras_checked_are_the_ones_pyproject_declares() -> None:
    """`exporter.extras` names each extra's modules; pyproject.toml its distributions. Here every
    distribution's import name is its own name, lower-cased."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    optional = declared["project"]["optional-dependencies"]

    def names(requirements: list[str]) -> tuple[str, ...]:
        return tuple(
            requirement.split(">")[0].split("<")[0].split("=")[0].strip().lower()
            for requirement in requirements
        )

    assert {extra: names(optional[extra]) for extra in extras.EXTRAS} == extras.EXTRAS
