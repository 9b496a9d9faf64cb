"""Durations and times: any input either parses or raises InvalidArgument, nothing else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.core.durations import format_duration, parse_duration, parse_time
from schedd.errors import InvalidArgument

anything = st.one_of(
    st.text(max_size=80),
    st.floats(),
    st.integers(),
    st.booleans(),
    st.none(),
    st.from_regex(r"\A[0-9.]{1,30}(ms|s|m|h|d)?\Z"),
)


@settings(max_examples=500, deadline=None)
@given(anything)
def test_parse_duration_only_raises_invalid_argument(value: object) -> None:
    try:
        ms = parse_duration(value, "f")
    except InvalidArgument as exc:
        assert exc.field == "f" and "expected" in exc.message
    else:
        assert 0 < ms <= 100 * 365 * 86_400_000


@settings(max_examples=300, deadline=None)
@given(anything)
def test_parse_time_only_raises_invalid_argument(value: object) -> None:
    try:
        parse_time(value, "t")
    except InvalidArgument as exc:
        assert exc.field == "t"


@given(st.integers(1, 10 * 365 * 86_400_000))
def test_format_then_parse_round_trips(ms: int) -> None:
    assert parse_duration(format_duration(ms), "f") == ms


@given(st.integers(0, 253_402_300_799_999))
def test_format_time_matches_the_datetime_rendering(ms: int) -> None:
    from datetime import UTC, datetime

    from schedd.core.durations import format_time

    expected = (
        datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{ms % 1000:03d}Z"
    )
    assert format_time(ms) == expected
