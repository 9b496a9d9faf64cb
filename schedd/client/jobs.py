"""A job's body from a Python call: ``job_body("reports.generate", {"day": 1}, in_="10m")``.

The options are the API's job fields (``docs/api.md``) under their own names, plus shortcuts for
the schedule: ``at``, ``in_`` (``in`` is a Python keyword), ``every``, ``cron`` and
``timezone``.  The body is checked with the server's own rules before it is sent, so a typo is
an ``InvalidArgument`` naming the field in the caller, not a round trip (limits that depend on
the server's configuration, such as the payload size, are left to the server).
"""

from __future__ import annotations

from typing import Any, Final

from schedd import clock
from schedd.core.validate import JOB_FIELDS, Defaults, parse_job
from schedd.errors import InvalidArgument

SCHEDULE_SHORTCUTS: Final = ("at", "in_", "every", "cron", "timezone")
_LOCAL_LIMITS: Final = Defaults(max_payload=1 << 40)  # the server checks its own limit


def job_body(task: str, payload: Any = None, **options: Any) -> dict[str, Any]:
    """The ``POST /jobs`` body for ``task`` with ``payload`` and ``options`` (see the module)."""
    body: dict[str, Any] = {"task": task}
    if payload is not None:
        body["payload"] = payload
    shortcuts = {k: options.pop(k) for k in SCHEDULE_SHORTCUTS if options.get(k) is not None}
    for key in SCHEDULE_SHORTCUTS:
        options.pop(key, None)
    unknown = sorted(set(options) - set(JOB_FIELDS))
    if unknown:
        known = ", ".join((*JOB_FIELDS[1:], *SCHEDULE_SHORTCUTS))
        raise InvalidArgument(
            f"{unknown[0]}: not a job option; expected one of: {known}", field=unknown[0]
        )
    body.update({k: v for k, v in options.items() if v is not None})
    if shortcuts:
        if "schedule" in body:
            raise InvalidArgument(
                f"schedule: give schedule or {', '.join(shortcuts)}, not both", field="schedule"
            )
        kinds = [k for k in ("at", "in_", "every", "cron") if k in shortcuts]
        if len(kinds) > 1:
            raise InvalidArgument(
                f"{kinds[1]}: give one of at, in_, every, cron, not {' and '.join(kinds)}",
                field=kinds[1].rstrip("_"),
            )
        schedule = {k.rstrip("_"): v for k, v in shortcuts.items()}
        body["schedule"] = schedule
    parse_job(body, now_ms=clock.wall_ms(), defaults=_LOCAL_LIMITS)
    return body
