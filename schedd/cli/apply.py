"""``schedctl apply -f FILE``: make the server's named jobs match a TOML or JSON file.

Each item of the file is a job body exactly as ``POST /api/v1/jobs`` takes it, plus an optional
``paused`` boolean, and must have a ``name``: the item's (namespace, name) is how apply finds
its job on the server.  For each item: no live (active or paused) job of that name → create it;
one → compare it with the item and, if they differ, ``PATCH`` only what changed; a change
``PATCH`` cannot make (task, queue, heartbeat_timeout, depends_on, idempotency_key) is refused,
or with ``--replace`` done by cancelling the job and submitting a new one; two or more live jobs
of that name → refused, naming them.  Applying the same file twice sends no write.

The comparison is semantic: both sides go through the server's own parser
(:func:`schedd.core.validate.parse_job`) into the :class:`JobSpec` it would store, so ``"1h"``
and ``3600``, an absent field and its default, or a cron expression's spacing compare equal.
Two defaults come from the server's config, which a client cannot see: ``retry.max_attempts``
and ``heartbeat_timeout``.  When an item leaves them out, they are taken to be what the job has
(left alone, never changed back).  Likewise ``paused``: absent means "leave it as it is".

The file is checked completely before anything is sent; every problem is reported at once,
naming the item (its position and name) and the field, with the server's own message (exit 2).

This module must not import ``schedd.cli.schedctl`` (which calls it: the architecture test
forbids import cycles of any kind), so the caller passes its ``server_error``.
"""

from __future__ import annotations

import math
import re
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from datetime import time as clock_time
from pathlib import Path
from typing import IO, Any, Final

import orjson

from schedd.cli.client import Client, CliError, Response, UsageError
from schedd.cli.render import clean
from schedd.client.servers import job_path
from schedd.core.durations import format_duration, format_time
from schedd.core.model import JobSpec, RecurringOptions, RetryPolicy, ScheduleKind
from schedd.core.validate import (
    JOB_FIELDS,
    RETRY_FIELDS,
    SCHEDULE_FIELDS,
    Defaults,
    parse_job,
)
from schedd.errors import SchedError

__all__ = [
    "Change",
    "Item",
    "Outcome",
    "Plan",
    "apply_file",
    "diff_specs",
    "load_items",
    "parse_items",
    "plan_item",
    "spec_of_view",
]

#: the job's own size limit is the server's (``scheduler.max_payload``, 413 when over it): a
#: client does not know it, so the local check leaves payload sizes to the server
_NO_PAYLOAD_LIMIT: Final = Defaults(max_payload=sys.maxsize)
#: the fields ``PATCH /jobs/{id}`` changes (by the first part of a change's field path)
PATCHABLE: Final = frozenset({"schedule", "payload", "priority", "retry", "timeout", "paused"})
#: changes shown as durations (the API's values are seconds)
_DURATIONS: Final = frozenset(
    {
        "schedule.every",
        "schedule.in",
        "schedule.jitter",
        "schedule.catchup_window",
        "retry.initial",
        "retry.max",
        "timeout",
        "heartbeat_timeout",
    }
)
_LIVE: Final = ("active", "paused")
_PAGE: Final = 1000
_MAX_PAGES: Final = 100
_BARE: Final = re.compile(r"[\w.:/+@-]+")
_SHOWN_JSON: Final = 60  # characters of a payload shown in a change
_AUTH: Final = (401, 403)  # the same for every item: stop at the first


# ---- the file ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One job of an apply file, checked."""

    index: int  # 1-based position in the file
    body: dict[str, Any]  # the job body as the API takes it (without paused)
    paused: bool | None  # None: leave the job's state alone
    spec: JobSpec  # as the server would store it (with the default defaults)

    @property
    def name(self) -> str:
        return str(self.body["name"])

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    @property
    def label(self) -> str:
        """How the item is named in messages: ``item 3 (name "nightly")``."""
        return f"item {self.index} (name {_quote(self.name)})"


def _quote(text: str) -> str:
    return '"' + clean(text).replace('"', '\\"') + '"'


def _read(path: str, stdin: IO[bytes] | None) -> tuple[bytes, str]:
    if path == "-":
        return (stdin or sys.stdin.buffer).read(), "stdin"
    try:
        return Path(path).read_bytes(), path
    except OSError as exc:
        raise UsageError(f"-f: cannot read {path!r}: {exc.strerror or exc}") from None


def _decode(data: bytes, fmt: str | None, where: str) -> tuple[Any, str]:
    """The file's document and its format; ``fmt`` is ``"toml"``, ``"json"`` or None (tell
    by the content)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if fmt is None and text.lstrip()[:1] == "{":
        fmt = "json"
    if fmt is None:  # "[" starts a JSON list and a TOML [[job]] alike: try both
        try:
            return orjson.loads(text), "json"
        except orjson.JSONDecodeError as json_exc:
            try:
                return tomllib.loads(text), "toml"
            except tomllib.TOMLDecodeError as toml_exc:
                raise UsageError(
                    f"{where}: neither JSON ({json_exc}) nor TOML ({toml_exc})"
                ) from None
    if fmt == "json":
        try:
            return orjson.loads(text), fmt
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON: {exc}") from None
    try:
        return tomllib.loads(text), "toml"
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{where}: not valid TOML: {exc}") from None


def _plain(value: Any, at: str) -> Any:
    """TOML's dates and times as the API takes them (RFC 3339 strings); a time without an
    offset, a bare date or a bare time of day is refused (which zone would it be in?)."""
    if isinstance(value, dict):
        return {k: _plain(v, f"{at}.{k}" if at else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{at}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.isoformat()
    if isinstance(value, datetime | date | clock_time):
        raise ValueError(
            f"{at}: expected a time with a zone offset like 2026-11-25T02:00:00Z, got the TOML "
            f"local value {value.isoformat()}"
        )
    return value


def _format_of(path: str) -> str | None:
    suffix = Path(path).suffix.lower() if path != "-" else ""
    return {".toml": "toml", ".json": "json"}.get(suffix)


_SHAPE: Final = '[[job]] tables (TOML), {"jobs": [...]} or a list of jobs (JSON)'


def _documents(doc: Any, fmt: str, where: str) -> list[Any]:
    """The items of a decoded file: TOML ``[[job]]`` tables, JSON ``{"jobs": [...]}`` or a
    JSON list."""
    key = "job" if fmt == "toml" else "jobs"
    if isinstance(doc, list) and fmt == "json":
        items: Any = doc
    elif isinstance(doc, dict):
        unknown = sorted(str(k) for k in doc if k != key)
        if unknown:
            raise UsageError(
                f"{where}: unknown top-level key {_quote(unknown[0])}; expected {_SHAPE}"
            )
        items = doc.get(key, [])
        if not isinstance(items, list):
            raise UsageError(f"{where}: {key}: expected a list of jobs, got {type(items).__name__}")
    else:
        raise UsageError(f"{where}: expected {_SHAPE}, got {type(doc).__name__}")
    if not items:
        raise UsageError(f"{where}: no jobs in the file; expected {_SHAPE}")
    return list(items)


def _check_item(raw: Any, index: int, now_ms: int) -> Item:
    """One item → :class:`Item`; raises ``ValueError`` naming the item and the field, with the
    server's own message where its parser found the problem."""
    if not isinstance(raw, dict):
        raise ValueError(f"item {index}: expected a job table/object, got {type(raw).__name__}")
    name = raw.get("name")
    who = (
        f"item {index} (name {_quote(name)})"
        if isinstance(name, str) and name
        else f"item {index}"
        + (f" (task {_quote(raw['task'])})" if isinstance(raw.get("task"), str) else "")
    )
    for key in raw:
        if key not in JOB_FIELDS and key != "paused":
            raise ValueError(
                f"{who}: {clean(str(key))}: unknown field; expected one of: "
                f"{', '.join(JOB_FIELDS)}, paused"
            )
    try:
        body = {k: _plain(v, k) for k, v in raw.items() if k != "paused"}
    except ValueError as exc:
        raise ValueError(f"{who}: {exc}") from None
    paused = raw.get("paused")
    if paused is not None and not isinstance(paused, bool):
        raise ValueError(f"{who}: paused: expected true or false, got {_shown('paused', paused)}")
    try:
        spec = parse_job(body, now_ms=now_ms, defaults=_NO_PAYLOAD_LIMIT)
    except SchedError as exc:  # InvalidArgument, PayloadTooLarge
        raise ValueError(f"{who}: {exc.message}") from None
    if spec.name is None:
        raise ValueError(
            f"{who}: name: required in an apply file (it is how apply finds the job on the server)"
        )
    return Item(index, body, paused, spec)


def parse_items(data: bytes, fmt: str | None, where: str, now_ms: int) -> list[Item]:
    """The checked items of a file's bytes; every problem at once as one :class:`UsageError`."""
    problems: list[str] = []
    items: list[Item] = []
    for index, raw in enumerate(_documents(*_decode(data, fmt, where), where), 1):
        try:
            items.append(_check_item(raw, index, now_ms))
        except ValueError as exc:
            problems.append(str(exc))
    seen: dict[tuple[str, str], Item] = {}
    keys: dict[tuple[str, str], Item] = {}
    for item in items:
        other = seen.setdefault((item.namespace, item.name), item)
        if other is not item:
            problems.append(
                f"{item.label}: name: the same namespace ({item.namespace}) and name as item "
                f"{other.index}; each job must be named once in a file"
            )
        key = item.spec.idempotency_key
        if key is not None and (other := keys.setdefault((item.namespace, key), item)) is not item:
            problems.append(
                f"{item.label}: idempotency_key: {_quote(key)} is also item {other.index}'s; "
                f"the server would answer both with one job"
            )
    if len(problems) == 1:
        raise UsageError(f"{where}: {problems[0]}; nothing was sent")
    if problems:
        lines = "\n".join(f"  {p}" for p in problems)
        raise UsageError(f"{where}: {len(problems)} problems; nothing was sent:\n{lines}")
    return items


def load_items(path: str, stdin: IO[bytes] | None = None, now_ms: int | None = None) -> list[Item]:
    """Read and check ``path`` (``-``: stdin): TOML or JSON by its extension, else by content."""
    data, where = _read(path, stdin)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return parse_items(data, _format_of(path), where, now)


# ---- comparing ---------------------------------------------------------------------------------


def spec_of_view(view: Mapping[str, Any]) -> JobSpec:
    """The :class:`JobSpec` of a job as the API shows it (``GET /jobs``): its view turned back
    into a body, through the same parser.  Raises ``InvalidArgument`` if it cannot be read.

    Both sides are parsed at time 0: an ``in`` schedule is compared by its delay (its resolved
    time depends on when it was submitted, and :func:`flatten` leaves it out)."""
    body = {k: view.get(k) for k in JOB_FIELDS}
    schedule = view.get("schedule")
    if isinstance(schedule, Mapping):
        if "in" in schedule:  # {"in": 600, "at": <resolved>}: the delay is what was given
            schedule = {"in": schedule["in"]}
        body["schedule"] = {k: v for k, v in schedule.items() if k in SCHEDULE_FIELDS}
    retry = view.get("retry")
    if isinstance(retry, Mapping):
        body["retry"] = {k: v for k, v in retry.items() if k in RETRY_FIELDS}
    return parse_job(body, now_ms=0, defaults=_NO_PAYLOAD_LIMIT)


def desired_spec(item: Item, current: JobSpec) -> JobSpec:
    """The item's spec with the defaults that come from the server's config (max attempts and
    heartbeat timeout) taken from the job: left out of the file, they are left alone."""
    defaults = replace(
        _NO_PAYLOAD_LIMIT,
        max_attempts=current.retry.max_attempts,
        heartbeat_timeout_ms=current.heartbeat_timeout_ms,
    )
    return parse_job(item.body, now_ms=0, defaults=defaults)


def _seconds(ms: int | None) -> int | float | None:
    if ms is None:
        return None
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _retry_fields(retry: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": retry.max_attempts,
        "initial": _seconds(retry.initial_ms),
        "max": _seconds(retry.max_ms),
        "multiplier": retry.multiplier,
        "jitter": retry.jitter,
    }


def _recurring_fields(timezone: str, o: RecurringOptions) -> dict[str, Any]:
    return {
        "timezone": timezone,
        "jitter": _seconds(o.jitter_ms),
        "misfire": o.misfire.value,
        "catchup_window": _seconds(o.catchup_window_ms),
        "overlap": o.overlap.value,
        "dst.gap": o.dst_gap.value,
        "dst.repeat": o.dst_repeat.value,
        "start_at": format_time(o.start_at_ms),
        "end_at": format_time(o.end_at_ms),
    }


def flatten(spec: JobSpec, paused: bool | None = None) -> dict[str, Any]:
    """A spec as ``field path → value`` in the API's terms (durations in seconds, times in
    RFC 3339).  ``schedule`` is ``{kind: value}`` (None: run now); ``paused`` only when given."""
    s = spec.schedule
    main: dict[str, Any] | None = {
        ScheduleKind.NOW: None,
        ScheduleKind.AT: {"at": format_time(s.at_ms)},
        ScheduleKind.IN: {"in": _seconds(s.in_ms)},
        ScheduleKind.EVERY: {"every": _seconds(s.every_ms)},
        ScheduleKind.CRON: {"cron": s.cron},
    }[s.kind]
    flat: dict[str, Any] = {
        "task": spec.task,
        "queue": spec.queue,
        "schedule": main,
    }
    if s.kind in (ScheduleKind.EVERY, ScheduleKind.CRON):
        options = _recurring_fields(s.timezone, s.options or RecurringOptions())
        flat.update({f"schedule.{k}": v for k, v in options.items()})
    flat.update(
        {
            "payload": spec.payload,
            "priority": spec.priority.value,
            **{f"retry.{k}": v for k, v in _retry_fields(spec.retry).items()},
            "timeout": _seconds(spec.timeout_ms),
            "heartbeat_timeout": _seconds(spec.heartbeat_timeout_ms),
            "depends_on": sorted(spec.depends_on),
            "idempotency_key": spec.idempotency_key,
        }
    )
    if paused is not None:
        flat["paused"] = paused
    return flat


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == 1.0``, but ``true`` is not ``1`` and key order does not count."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


@dataclass(frozen=True)
class Change:
    field: str  # "schedule.cron", "priority", "schedule" (another kind of schedule)
    old: Any  # in the API's terms
    new: Any

    @property
    def group(self) -> str:
        """The body field that holds it (what a PATCH would send)."""
        return self.field.split(".", 1)[0]

    def text(self) -> str:
        return f"{self.field} {_shown(self.field, self.old)} → {_shown(self.field, self.new)}"

    def as_json(self) -> dict[str, Any]:
        return {"field": self.field, "from": self.old, "to": self.new}


def diff_specs(
    current: JobSpec,
    desired: JobSpec,
    current_paused: bool | None = None,
    desired_paused: bool | None = None,
) -> list[Change]:
    """What differs, field by field, in the order of the job body (``paused`` compared only
    when the file gives it)."""
    old = flatten(current, None if desired_paused is None else current_paused)
    new = flatten(desired, desired_paused)
    changes: list[Change] = []
    for key in dict.fromkeys([*new, *old]):
        a, b = old.get(key), new.get(key)
        if same_json(a, b):
            continue
        if (
            key == "schedule"
            and isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
        ):
            kind = next(iter(a))
            changes.append(Change(f"schedule.{kind}", a[kind], b[kind]))
        elif key.startswith("schedule.") and (key not in old or key not in new):
            continue  # one side is not recurring: the schedule's change says it all
        else:
            changes.append(Change(key, a, b))
    return changes


def _shown(field: str, value: Any) -> str:
    if field == "schedule":
        if not isinstance(value, Mapping):
            return "now"
        ((kind, inner),) = value.items()
        return f"{kind} {_shown(f'schedule.{kind}', inner)}"
    if value is None:
        return "none"
    if field in _DURATIONS and isinstance(value, int | float) and not isinstance(value, bool):
        return format_duration(round(value * 1000))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    if isinstance(value, str):
        text = clean(value)
        return text if _BARE.fullmatch(text) else "'" + text.replace("'", "\\'") + "'"
    text = clean(orjson.dumps(value).decode())
    return text if len(text) <= _SHOWN_JSON else text[: _SHOWN_JSON - 1] + "…"


# ---- deciding ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to do with one item, decided from the live jobs of its name."""

    action: str  # create | update | replace | unchanged | error
    job_id: str | None = None  # the live job (update, replace, unchanged, some errors)
    changes: tuple[Change, ...] = ()
    patch: dict[str, Any] | None = None  # update: the PATCH body
    error: str | None = None
    pause_new: bool = False  # create, replace: pause the new job once submitted


def _is_paused(view: Mapping[str, Any]) -> bool:
    return view.get("status") == "paused"


def _patch_body(item: Item, desired: JobSpec, changes: Sequence[Change]) -> dict[str, Any]:
    groups = {c.group for c in changes}
    body: dict[str, Any] = {}
    if "schedule" in groups:
        body["schedule"] = item.body.get("schedule")  # as the file says: the server parses it
    if "payload" in groups:
        body["payload"] = item.body.get("payload")
    if "priority" in groups:
        body["priority"] = desired.priority.value
    if "retry" in groups:  # the whole policy, with what the file leaves out as the job has it
        body["retry"] = _retry_fields(desired.retry)
    if "timeout" in groups:
        body["timeout"] = _seconds(desired.timeout_ms)
    if "paused" in groups:
        body["paused"] = item.paused
    return body


def plan_item(item: Item, live: Sequence[Mapping[str, Any]], *, replace_jobs: bool) -> Plan:
    """Pure: what applying ``item`` means, given the live (active or paused) jobs of its name."""
    if not live:
        return Plan("create", pause_new=bool(item.paused))
    if len(live) > 1:
        ids = ", ".join(clean(str(v.get("id"))) for v in live)
        return Plan(
            "error",
            error=f"{len(live)} live jobs have this name in namespace {item.namespace} ({ids}); "
            f"apply needs one: cancel the others (schedctl cancel ID)",
        )
    view = live[0]
    job_id = str(view.get("id"))
    try:
        current = spec_of_view(view)
        desired = desired_spec(item, current)
    except SchedError as exc:
        return Plan(
            "error",
            job_id,
            error=f"cannot read job {clean(job_id)} as the server shows it ({exc.message}); is "
            f"schedctl older than the server?",
        )
    changes = tuple(diff_specs(current, desired, _is_paused(view), item.paused))
    if not changes:
        return Plan("unchanged", job_id)
    fixed = [c for c in changes if c.group not in PATCHABLE]
    if not fixed:
        return Plan("update", job_id, changes, patch=_patch_body(item, desired, changes))
    what = ", ".join(c.text() for c in fixed)
    if not replace_jobs:
        return Plan(
            "error",
            job_id,
            changes,
            error=f"{what} cannot change on a job; --replace cancels job {clean(job_id)} and "
            f"submits a new one",
        )
    key = desired.idempotency_key
    if key is not None and key == current.idempotency_key:
        return Plan(
            "error",
            job_id,
            changes,
            error=f"{what} cannot change on a job, and a replacement cannot reuse "
            f"idempotency_key {_quote(key)}: job {clean(job_id)} keeps it after it is "
            f"cancelled, and the server would answer with that job; give the item a new "
            f"idempotency_key to replace it",
        )
    paused = _is_paused(view) if item.paused is None else item.paused
    return Plan("replace", job_id, changes, pause_new=paused)


# ---- doing -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    item: Item
    action: str  # create | update | replace | unchanged | error
    dry_run: bool
    job_id: str | None = None  # the job now (the new one when replaced)
    replaced_id: str | None = None
    changes: tuple[Change, ...] = ()
    error: str | None = None
    paused: bool = False  # a new job that was (or would be) paused

    def line(self) -> str:
        who = clean(self.item.name)
        if self.item.namespace != "default":
            who = f"{self.item.namespace}/{who}"
        diff = ", ".join(c.text() for c in self.changes)
        job = clean(self.job_id or "")
        if self.action == "error":
            return f"error {who}: {self.error}"
        if self.action == "unchanged":
            return f"unchanged {who} {job}"
        if self.action == "create":
            paused = " (paused)" if self.paused else ""
            return f"would create {who}{paused}" if self.dry_run else f"created {who} {job}{paused}"
        if self.action == "update":
            return f"{'would update' if self.dry_run else 'updated'} {who} {job}: {diff}"
        if self.dry_run:
            return f"would replace {who} {clean(self.replaced_id or '')}: {diff}"
        return f"replaced {who} {clean(self.replaced_id or '')} → {job}: {diff}"

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.item.name,
            "namespace": self.item.namespace,
            "action": self.action,
            "dry_run": self.dry_run,
            "id": self.job_id,
            "replaced_id": self.replaced_id,
            "changes": [c.as_json() for c in self.changes],
            "error": self.error,
        }


class _ItemFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class _Applier:
    client: Client
    server_error: Callable[[Response], CliError]
    dry_run: bool
    replace_jobs: bool

    def _call(self, method: str, path: str, **kwargs: Any) -> Response:
        resp = self.client.request(method, path, **kwargs)
        if resp.status in _AUTH:
            raise self.server_error(resp)  # every item would fail alike: stop
        if resp.status >= 400:
            raise _ItemFailed(self.server_error(resp).message)
        return resp

    def _json(self, resp: Response) -> Mapping[str, Any]:
        data = resp.json()
        return data if isinstance(data, Mapping) else {}

    def live_jobs(self, item: Item) -> list[Mapping[str, Any]]:
        """The active and paused jobs named like the item, in its namespace."""
        query = [("name", item.name), ("namespace", item.namespace), ("limit", str(_PAGE))]
        found: list[Mapping[str, Any]] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = [*query, ("cursor", cursor)] if cursor else query
            data = self._json(self._call("GET", "/api/v1/jobs", query=page))
            jobs = data.get("jobs")
            found.extend(
                j
                for j in (jobs if isinstance(jobs, list) else [])
                if isinstance(j, Mapping)
                and j.get("status") in _LIVE
                and j.get("name") == item.name  # a server without the name filter lists all
                and j.get("namespace") == item.namespace
            )
            cursor = data.get("next_cursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return found

    def _submit(self, item: Item) -> str:
        resp = self._call("POST", "/api/v1/jobs", body=orjson.dumps(item.body))
        job = self._json(resp)
        job_id = str(job.get("id"))
        if resp.status == 200:  # the idempotency key is another job's
            raise _ItemFailed(
                f"idempotency_key {_quote(str(item.spec.idempotency_key))} already belongs to "
                f"job {clean(job_id)} ({clean(str(job.get('status')))}, name "
                f"{_quote(str(job.get('name')))}), so nothing was submitted; give the item a new "
                f"idempotency_key"
            )
        return job_id

    def _pause(self, job_id: str) -> None:
        try:
            self._call("PATCH", job_path(job_id), body=orjson.dumps({"paused": True}))
        except _ItemFailed as exc:
            raise _ItemFailed(
                f"submitted job {clean(job_id)} but could not pause it: {exc.message}"
            ) from None

    def apply(self, item: Item) -> Outcome:
        try:
            plan = plan_item(item, self.live_jobs(item), replace_jobs=self.replace_jobs)
        except _ItemFailed as exc:
            return Outcome(item, "error", self.dry_run, error=exc.message)
        outcome = Outcome(
            item,
            plan.action,
            self.dry_run,
            plan.job_id,
            changes=plan.changes,
            error=plan.error,
            paused=plan.pause_new,
        )
        if plan.action == "replace":
            outcome.replaced_id, outcome.job_id = plan.job_id, None
        if self.dry_run or plan.action in ("error", "unchanged"):
            return outcome
        try:
            self._write(item, plan, outcome)
        except _ItemFailed as exc:
            outcome.action, outcome.error = "error", exc.message
        return outcome

    def _write(self, item: Item, plan: Plan, outcome: Outcome) -> None:
        if plan.action == "update":
            self._call("PATCH", job_path(str(plan.job_id)), body=orjson.dumps(plan.patch))
            return
        if plan.action == "replace":
            old = str(plan.job_id)
            self._call("DELETE", job_path(old))
            try:
                outcome.job_id = self._submit(item)
            except _ItemFailed as exc:
                raise _ItemFailed(
                    f"cancelled job {clean(old)}, but submitting its replacement failed: "
                    f"{exc.message}; apply again to submit it"
                ) from None
        else:
            outcome.job_id = self._submit(item)
        if plan.pause_new:  # a job cannot be submitted paused: pause it right after
            self._pause(outcome.job_id)


_PAST = {"create": "created", "update": "updated", "replace": "replaced"}
_FUTURE = {"create": "to create", "update": "to update", "replace": "to replace"}


def summary(outcomes: Sequence[Outcome], dry_run: bool) -> str:
    """``3 created, 1 updated, 2 unchanged, 1 failed`` (dry run: ``… to create …``)."""
    words = _FUTURE if dry_run else _PAST
    counts: dict[str, int] = {}
    for o in outcomes:
        word = "failed" if o.action == "error" else words.get(o.action, o.action)
        counts[word] = counts.get(word, 0) + 1
    order = [*words.values(), "unchanged", "failed"]
    text = ", ".join(f"{counts[w]} {w}" for w in order if w in counts)
    return f"dry run, nothing was changed: {text}" if dry_run else text


def _emit(out: IO[bytes], outcome: Outcome, output: str) -> None:
    if output == "json":
        out.write(orjson.dumps(outcome.as_json()) + b"\n")
    else:
        out.write(outcome.line().encode("utf-8", "replace") + b"\n")
    out.flush()


def apply_file(
    client: Client,
    path: str,
    *,
    dry_run: bool,
    replace: bool,
    output: str,
    out: IO[bytes],
    err: IO[str],
    server_error: Callable[[Response], CliError],
    stdin: IO[bytes] | None = None,
    now_ms: int | None = None,
) -> int:
    """``schedctl apply -f PATH [--dry-run] [--replace]``: returns the exit code, 0 when every
    item was applied (or would be), 1 when any failed (the others are still applied).

    Raises :class:`UsageError` (exit 2) for a bad file, before any request; lets the client's
    :class:`~schedd.cli.client.Unreachable` (exit 4) through; a 401/403 stops at once with
    ``server_error``'s error.  ``output`` ``json`` prints one JSON object per item; any other
    value one line per item and a summary on stderr.
    """
    items = load_items(path, stdin, now_ms)
    applier = _Applier(client, server_error, dry_run, replace)
    outcomes: list[Outcome] = []
    try:
        for item in items:
            outcome = applier.apply(item)
            outcomes.append(outcome)
            _emit(out, outcome, output)
    except CliError:
        if output != "json" and outcomes:
            err.write(f"schedctl: stopped after {len(outcomes)} of {len(items)} jobs\n")
        raise
    if output != "json":
        err.write(f"schedctl: {summary(outcomes, dry_run)}\n")
    failed = any(o.action == "error" for o in outcomes)
    return CliError.exit_code if failed else 0
