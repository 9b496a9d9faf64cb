"""Input errors that say exactly what is wrong: the cron field out of range, the time zone
meant, a negative duration."""

from __future__ import annotations

import pytest

from schedd.api.zones import zone_like
from schedd.core.durations import parse_duration
from schedd.core.validate import cron_field_problem, parse_job
from schedd.errors import InvalidArgument, UnknownZone


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("61 * * * *", "the minute field '61' is out of range: expected 0-59"),
        ("0 24 * * *", "the hour field '24' is out of range: expected 0-23"),
        ("0 2 0 * *", "the day-of-month field '0' is out of range: expected 1-31"),
        ("0 2 * 13 *", "the month field '13' is out of range: expected 1-12"),
        ("0 2 * * 1-9", "the day-of-week field '1-9' is out of range: expected 0-7"),
        ("0 2 * * * 60", "the second field '60' is out of range: expected 0-59"),
        ("*/0 * * * *", "the minute field's step '0': expected a whole number from 1"),
    ],
)
def test_a_cron_field_out_of_range_is_named(cron: str, says: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_job({"task": "t", "schedule": {"cron": cron}}, now_ms=0)
    assert err.value.field == "schedule.cron"
    assert says in err.value.message and repr(cron) in err.value.message


def test_a_good_cron_has_no_field_problem() -> None:
    assert cron_field_problem("*/15 0-23 1,15 * mon-fri") is None


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("berlin", "Europe/Berlin"),
        ("europe/berlin", "Europe/Berlin"),
        ("Europe/Berln", "Europe/Berlin"),
        ("new york", "America/New_York"),
        ("Mars/Olympus", None),
    ],
)
def test_a_time_zone_not_found_suggests_the_one_meant(given: str, meant: str | None) -> None:
    assert zone_like(given) == meant
    with pytest.raises(UnknownZone) as err:  # the pure core says what was given, no more
        parse_job({"task": "t", "schedule": {"cron": "0 2 * * *", "timezone": given}}, now_ms=0)
    assert err.value.zone == given and "did you mean" not in err.value.message
    assert err.value.field == "schedule.timezone"


def test_a_negative_duration_says_it_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="expected a positive duration"):
        parse_duration("-5m", "schedule.in")
