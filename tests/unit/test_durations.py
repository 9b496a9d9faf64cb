"""Durations and times at the edges (API bodies, the config file, schedctl options): what is
accepted up to the exact limits, and the message a bad value gets (field, expectation, value)."""

from __future__ import annotations

from typing import Any

import pytest

from schedd.core.durations import format_duration, parse_duration, parse_time
from schedd.errors import InvalidArgument

HUNDRED_YEARS_MS = 100 * 365 * 86_400_000
T_2026 = 1_795_572_000_000  # 2026-11-25T02:00:00Z

DURATIONS: list[tuple[Any, int]] = [
    ("90", 90_000),  # a number of seconds written as a string
    ("1.5", 1_500),
    ("1h 30m", 5_400_000),  # spaces between the parts are ignored
    (" 1h30m ", 5_400_000),
    ("1d 2h 3m 4s 5ms", 93_784_005),
    ("0" * 62 + "1s", 1_000),  # 64 characters: the longest text accepted
    ("1h " * 32, 32 * 3_600_000),  # spaces do not count
    (3_153_600_000, HUNDRED_YEARS_MS),  # 100 years as a number of seconds
    ("3153600000", HUNDRED_YEARS_MS),
    ("36500d", HUNDRED_YEARS_MS),  # 100 years in units
    ("876000h", HUNDRED_YEARS_MS),
]


@pytest.mark.parametrize(("value", "ms"), DURATIONS, ids=[repr(d[0])[:30] for d in DURATIONS])
def test_durations_are_accepted_up_to_the_limits(value: Any, ms: int) -> None:
    assert parse_duration(value, "f") == ms


BAD_DURATIONS: list[tuple[Any, str]] = [
    (
        float("nan"),
        "f: expected a finite number of seconds up to 100 years, got nan",
    ),
    (
        float("inf"),
        "f: expected a finite number of seconds up to 100 years, got inf",
    ),
    (
        3_153_600_001,
        "f: expected a finite number of seconds up to 100 years, got 3153600001",
    ),
    (
        "inf",
        'f: expected a duration like "90s", "5m", "1h30m" or a number of seconds, got \'inf\'',
    ),
    (
        "nan",
        'f: expected a duration like "90s", "5m", "1h30m" or a number of seconds, got \'nan\'',
    ),
    (
        "3153600001",
        'f: expected a duration like "90s", "5m", "1h30m" or a number of seconds, '
        "got '3153600001'",
    ),
    ("36501d", "f: expected a duration up to 100 years, got '36501d'"),
    ("36500d1ms", "f: expected a duration up to 100 years, got '36500d1ms'"),  # 1 ms over
    ("876001h", "f: expected a duration up to 100 years, got '876001h'"),
    ("0" * 63 + "1s", 'f: expected a duration like "90s", got a string of 65 characters'),
    ("1h " * 33, 'f: expected a duration like "90s", got a string of 66 characters'),
    ([], 'f: expected a duration (seconds or a string like "90s"), got list'),
    (None, 'f: expected a duration (seconds or a string like "90s"), got NoneType'),
    (True, 'f: expected a duration (seconds or a string like "90s"), got a boolean'),
    (0, "f: expected a positive duration, got 0"),
    ("-5s", "f: expected a positive duration, got '-5s'"),
    (-1, "f: expected a positive duration, got -1"),
]


@pytest.mark.parametrize(
    ("value", "message"), BAD_DURATIONS, ids=[repr(d[0])[:30] for d in BAD_DURATIONS]
)
def test_bad_durations_say_what_was_expected(value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_duration(value, "f")
    assert (info.value.field, info.value.message) == ("f", message)


def test_zero_is_a_duration_only_where_allowed() -> None:
    assert parse_duration("0s", "f", allow_zero=True) == 0
    assert parse_duration(0, "f", allow_zero=True) == 0
    with pytest.raises(InvalidArgument, match=r"^f: expected a positive duration, got '0s'$"):
        parse_duration("0s", "f")


def test_format_duration() -> None:
    assert format_duration(0) == "0s"
    assert format_duration(5_400_000) == "1h30m"
    assert format_duration(93_784_005) == "1d2h3m4s5ms"
    assert format_duration(250) == "250ms"


TIMES: list[tuple[str, int]] = [
    ("2026-11-25T02:00:00Z", T_2026),
    ("2026-11-25T02:00:00z", T_2026),  # a lowercase z is UTC too
    ("2026-11-25t02:00:00z", T_2026),
    ("2026-11-25T03:00:00+01:00", T_2026),
    ("2026-11-25T02:00:00.250Z", T_2026 + 250),
    (" 2026-11-25T02:00:00Z ", T_2026),
]


@pytest.mark.parametrize(("text", "ms"), TIMES, ids=[t[0] for t in TIMES])
def test_times_with_a_zone_are_accepted(text: str, ms: int) -> None:
    assert parse_time(text, "at") == ms


BAD_TIMES: list[tuple[Any, str]] = [
    (5, 'at: expected an RFC 3339 time like "2026-11-25T02:00:00Z", got int'),
    (None, 'at: expected an RFC 3339 time like "2026-11-25T02:00:00Z", got NoneType'),
    (
        "2026-11-25T02:00:00",
        'at: expected an RFC 3339 time with a zone offset like "2026-11-25T02:00:00Z", '
        "got '2026-11-25T02:00:00'",
    ),
    (
        "2026-11-25",
        'at: expected an RFC 3339 time with a zone offset like "2026-11-25T02:00:00Z", '
        "got '2026-11-25'",
    ),
    (
        "tomorrow",
        'at: expected an RFC 3339 time with a zone offset like "2026-11-25T02:00:00Z", '
        "got 'tomorrow'",
    ),
]


@pytest.mark.parametrize(("value", "message"), BAD_TIMES, ids=[repr(b[0]) for b in BAD_TIMES])
def test_bad_times_say_what_was_expected(value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_time(value, "at")
    assert (info.value.field, info.value.message) == ("at", message)
