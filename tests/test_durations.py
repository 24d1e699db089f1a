from __future__ import annotations

import pytest

from exporter.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("1s", 1.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("14d", 14 * 86400.0),
        ("2w", 14 * 86400.0),
        ("1.5s", 1.5),
        ("1m30s500ms", 90.5),
        (" 1s ", 1.0),
    ],
)
def test_parses_prometheus_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("1", "missing unit"),
        ("10", "missing unit"),
        ("5x", "not a duration"),
        ("s", "not a duration"),
        ("-1s", "not a duration"),
        ("1s1m", "largest to smallest"),
        ("1s1s", "largest to smallest"),
        ("1 s", "not a duration"),
    ],
)
def test_rejects_what_is_not_a_duration(text: str, why: str) -> None:
    with pytest.raises(DurationError, match=why):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [0.0, 0.1, 0.5, 1.0, 61.0, 3600.0, 90061.5, 14 * 86400.0])
def test_format_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_format_is_short() -> None:
    assert format_duration(1.0) == "1s"
    assert format_duration(0.5) == "500ms"
    assert format_duration(5400.0) == "1h30m"
