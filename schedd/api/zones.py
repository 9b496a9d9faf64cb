"""The IANA zone a user probably meant (``berlin`` → ``Europe/Berlin``), said with the error
of a time zone that is not one.  Here, not in the pure core: it lists the zones the system
knows (hundreds of files read once, cached), so the API asks it in a worker thread."""

from __future__ import annotations

import difflib
import functools
from zoneinfo import available_timezones

from schedd.core.validate import NOT_IANA_ZONES


@functools.cache
def _zones() -> tuple[dict[str, str], dict[str, str]]:
    """Every IANA zone by its name, and by its last part (a city), in lower case."""
    full: dict[str, str] = {}
    city: dict[str, str] = {}
    for zone in sorted(available_timezones()):
        if zone.startswith(("right/", "posix/")) or zone in NOT_IANA_ZONES:
            continue
        full[zone.lower()] = zone
        city.setdefault(zone.rsplit("/", 1)[-1].lower(), zone)
    return full, city


def zone_like(text: str) -> str | None:
    """The IANA zone ``text`` probably means: the same in another case, a city's name, or a
    close spelling of either (``Europe/Berln``); None when nothing is close."""
    full, city = _zones()
    key = text.strip().lower().replace(" ", "_")
    last = key.rsplit("/", 1)[-1]
    for table, wanted in ((full, key), (full, last), (city, last)):
        if wanted in table:
            return table[wanted]
    for table, wanted in ((full, key), (city, last)):
        close = difflib.get_close_matches(wanted, list(table), n=1, cutoff=0.8)
        if close:
            return table[close[0]]
    return None
