"""Plain-text rendering for ``schedctl``: tables and detail views that fit the terminal.

Everything here is pure: values in, one string out, laid out for a :class:`Style` (the width
to fit, the time to count ages from, whether to add the wide columns).  Cells are cleaned of
control characters (a task name or an error message must not be able to move the cursor or
recolour the terminal) and cut with ``…`` when a column has to give up room; an error is never
cut: it gets lines of its own, wrapped.  When the output is not a terminal nothing is cut.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from schedd.core.durations import format_duration
from schedd.core.model import RecurringOptions

WIDTH = 80
UNLIMITED = 1 << 20  # the width when the output is not a terminal: nothing is cut
_GAP = "  "
_MIN_COL = 3
_MIN_FLEX = 8
ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class Style:
    """How to lay out: ``width`` columns (:data:`UNLIMITED`: cut nothing), ``wide`` for more
    columns, and the instant ages ("5m ago", "in 2h") are counted from: ``clock()`` read as
    each is printed (a command that waits prints ages as of when it prints them), else a fixed
    ``now_ms`` (None, and no clock: no ages shown)."""

    width: int = WIDTH
    now_ms: int | None = None
    wide: bool = False
    clock: Callable[[], int] | None = None
    color: bool = False  # colour job statuses and run states (a terminal, NO_COLOR unset)

    @property
    def now(self) -> int | None:
        return self.clock() if self.clock is not None else self.now_ms


PLAIN = Style()

#: the colour (an SGR code) of each job status and run state on a terminal: green for what went
#: well, red for what failed, cyan for what runs or waits for a worker, yellow for what is held
#: back, grey for what will not run
COLORS = {
    "succeeded": "32",
    "done": "32",
    "active": "32",
    "failed": "31",
    "queued": "36",
    "running": "36",
    "retrying": "33",
    "blocked": "33",
    "paused": "33",
    "cancelled": "90",
    "skipped": "90",
}


def painted(text: str, color: bool) -> str:
    """``text`` in the colour of its first word (a status or state), when ``color``."""
    code = COLORS.get(text.split(" ", 1)[0]) if color and text else None
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def job_status(job: Mapping[str, Any]) -> str:
    """A job's status as shown: ``failed`` for a done job whose latest run failed for good (the
    API's ``status`` says only that nothing more will run)."""
    status = fmt_value(job.get("status"))
    latest = job.get("latest_run")
    if status == "done" and isinstance(latest, Mapping) and latest.get("state") == "failed":
        return "failed"
    return status


# ---- cells -----------------------------------------------------------------------------------


def clean(text: str) -> str:
    """One line of printable text: whitespace controls become spaces, other controls escapes."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\n\r\t\v\f":
            out.append(" ")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif unicodedata.category(ch) in ("Zs",):
            out.append(" ")
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (East Asian wide characters take two)."""
    if text.isascii():
        return len(text)
    return sum(_char_width(ch) for ch in text)


def truncate(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, ending in ``…`` when something was cut."""
    if display_width(text) <= width:
        return text
    if width <= 0:
        return ""
    out = []
    used = 0
    for ch in text:
        w = _char_width(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + ELLIPSIS


def _pad(text: str, width: int) -> str:
    return text + " " * (width - display_width(text))


def parse_api_time(value: object) -> datetime | None:
    """An API time (RFC 3339 string with an offset, or Unix ms) as an aware datetime."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith(("z", "Z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt if dt.tzinfo is not None else None


def fmt_time(value: object) -> str:
    """An API time (RFC 3339 string, or Unix ms) as ``2026-11-25 02:00:00Z``; ``-`` for none."""
    if value is None or value == "":
        return "-"
    dt = parse_api_time(value)
    if dt is None:
        return clean(value) if isinstance(value, str) else fmt_value(value)
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_age(ms: int) -> str:
    """A coarse length of time: ``45s``, ``12m``, ``3h5m``, ``2d4h``."""
    s = abs(ms) // 1000
    if s < 60:
        return f"{s}s"
    m = s // 60
    if m < 60:
        return f"{m}m"
    h = m // 60
    if h < 48:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"


def relative(value: object, now_ms: int | None) -> str:
    """``5m ago`` or ``in 2h`` from ``now_ms``; empty when either is unknown."""
    dt = parse_api_time(value)
    if dt is None or now_ms is None:
        return ""
    delta = round(dt.timestamp() * 1000) - now_ms
    if abs(delta) < 1000:
        return "now"
    return f"in {fmt_age(delta)}" if delta > 0 else f"{fmt_age(delta)} ago"


def fmt_when(value: object, style: Style = PLAIN) -> str:
    """:func:`fmt_time` and, when the style has a now, how long ago or ahead:
    ``2026-11-25 02:00:00Z (5m ago)``."""
    text = fmt_time(value)
    rel = relative(value, style.now)
    return f"{text} ({rel})" if rel and text != "-" else text


def in_zone(value: object, zone: object) -> str:
    """An API time in an IANA zone with its offset, ``2026-11-25 03:00:00+01:00 Europe/Berlin``;
    empty for UTC, an unknown zone or no time."""
    dt = parse_api_time(value)
    if dt is None or not isinstance(zone, str) or zone in ("UTC", "Etc/UTC", ""):
        return ""
    try:
        local = dt.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return ""
    return f"{local.isoformat(sep=' ')} {clean(zone)}"


def fmt_value(value: object) -> str:
    """Any JSON value as one short line: ``-`` for null, yes/no, lists comma-joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(fmt_value(v) for v in value) if value else "-"
    try:
        return clean(orjson.dumps(value).decode())
    except TypeError:
        return clean(repr(value))


def fmt_seconds(value: object) -> str:
    """An API duration (seconds as a number, or a string like ``"5m"``) as ``1h30m``."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return format_duration(round(value * 1000))
    return fmt_value(value)


_RETRY_DURATIONS = ("initial", "max")


def fmt_retry(retry: object) -> str:
    """``{"max_attempts": 3, "initial": 1, ...}`` → ``max_attempts=3 initial=1s ...``."""
    if not isinstance(retry, Mapping) or not retry:
        return fmt_value(retry)
    parts = []
    for key, value in retry.items():
        shown = fmt_seconds(value) if key in _RETRY_DURATIONS else fmt_value(value)
        parts.append(f"{clean(str(key))}={shown}")
    return " ".join(parts)


# ---- layouts ---------------------------------------------------------------------------------


def _water_fill(natural: list[int], avail: int) -> list[int]:
    """Widths summing to at most ``avail``: the widest columns give up room first."""
    if sum(natural) <= avail:
        return list(natural)
    # the largest cap c with sum(min(w, c)) <= avail, then hand out what is left one by one
    lo, hi = 0, max(natural, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(w, mid) for w in natural) <= avail:
            lo = mid
        else:
            hi = mid - 1
    widths = [min(w, lo) for w in natural]
    spare = avail - sum(widths)
    for i, w in enumerate(natural):
        if spare <= 0:
            break
        if w > widths[i]:
            widths[i] += 1
            spare -= 1
    return widths


def _fit(natural: list[int], avail: int, keep: Sequence[int] = ()) -> list[int]:
    """Column widths that sum to at most ``avail``.

    Columns in ``keep`` (ids, times) are cut only if the others cannot make enough room while
    keeping :data:`_MIN_FLEX` columns each.
    """
    if sum(natural) <= avail:
        return list(natural)
    flex = [i for i in range(len(natural)) if i not in keep]
    fixed = sum(natural[i] for i in range(len(natural)) if i in keep)
    if flex and fixed + sum(min(natural[i], _MIN_FLEX) for i in flex) <= avail:
        shrunk = _water_fill([natural[i] for i in flex], avail - fixed)
        widths = list(natural)
        for i, w in zip(flex, shrunk, strict=True):
            widths[i] = w
        return widths
    return _water_fill(natural, avail)


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int = WIDTH,
    keep: Sequence[int] = (),
    drop: Sequence[int] = (),
    colored: Sequence[int] = (),
    color: bool = False,
) -> str:
    """Left-aligned columns separated by two spaces, every line at most ``width`` columns;
    with ``color``, the cells of the ``colored`` columns in their state's colour (laid out as
    if they had none).

    ``keep`` names the columns to cut last.  When the kept columns and the others (at their
    smallest) cannot fit, the columns of ``drop`` are left out, in that order, before a kept
    one is cut.  If even three columns each cannot fit, the rightmost columns are dropped.
    """
    shown = list(range(len(headers)))
    head = [clean(h) for h in headers]
    body = [[clean(c) for c in row] for row in rows]
    natural_of = [
        max([display_width(head[i])] + [display_width(r[i]) for r in body if i < len(r)])
        for i in range(len(headers))
    ]

    def needs(cols: list[int]) -> int:
        return sum(
            natural_of[i] if i in keep else min(natural_of[i], _MIN_FLEX) for i in cols
        ) + len(_GAP) * (len(cols) - 1)

    for i in drop:
        if needs(shown) <= width:
            break
        shown.remove(i)
    while len(shown) > 1 and len(shown) * _MIN_COL + len(_GAP) * (len(shown) - 1) > width:
        shown.pop()
    keep_shown = [shown.index(i) for i in keep if i in shown]
    natural = [natural_of[i] for i in shown]
    widths = _fit(natural, width - len(_GAP) * (len(shown) - 1), keep_shown)
    lines = []
    for n, row in enumerate([head, *body]):
        cells = [
            truncate(row[i] if i < len(row) else "", w) for i, w in zip(shown, widths, strict=True)
        ]
        out = []
        for k, c in enumerate(cells):
            pad = " " * (widths[k] - display_width(c))
            out.append(painted(c, color and n > 0 and shown[k] in colored) + pad)
        lines.append(_GAP.join(out).rstrip())
    return "\n".join(lines)


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """``text`` (cleaned) in lines of at most ``width`` columns, each starting with ``indent``
    (the first with ``first`` when given): nothing is cut.  Words are kept whole where they fit
    a line, else broken; wide characters count two columns."""
    lead = indent if first is None else first
    room = max(width - max(display_width(lead), display_width(indent)), 20)
    text = clean(text)
    if display_width(text) <= room:  # as it is, inner spacing included
        return [lead + text]
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        if not word:
            continue
        candidate = f"{line} {word}" if line else word
        if display_width(candidate) <= room:
            line = candidate
            continue
        if line:
            lines.append(line)
        while display_width(word) > room:  # a word longer than a line: broken
            cut, used = 0, 0
            while cut < len(word) and used + _char_width(word[cut]) <= room:
                used += _char_width(word[cut])
                cut += 1
            lines.append(word[:cut])
            word = word[cut:]
        line = word
    lines.append(line)
    return [(lead if i == 0 else indent) + part for i, part in enumerate(lines)]


def block(text: str, width: int, indent: str) -> list[str]:
    """A text of several lines (a traceback), each cleaned and wrapped under ``indent``."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        stripped = line.rstrip()
        body = stripped.lstrip(" ")
        pad = indent + " " * (len(stripped) - len(body))
        out += wrap(body, width, pad) if body else [indent.rstrip()]
    return out


def details(pairs: Sequence[tuple[str, str]], width: int = WIDTH, color: bool = False) -> str:
    """``key: value`` lines with the values aligned, each line at most ``width`` columns: a
    value too long for its line goes on, wrapped, on the next ones (nothing is cut); with
    ``color``, a ``status`` or ``state`` in its colour."""
    if not pairs:
        return ""
    keys = [clean(k) + ":" for k, _ in pairs]
    key_width = min(max(display_width(k) for k in keys), width // 3)
    lines = []
    for key, (_, value) in zip(keys, pairs, strict=True):
        key = truncate(key, key_width)
        head = _pad(key, key_width) + " "
        text = clean(value)
        if display_width(head) + display_width(text) <= width:
            shown = painted(text, color) if key.rstrip(": ") in ("status", "state") else text
            lines.append((head + shown).rstrip())
        else:
            lines += [line.rstrip() for line in wrap(text, width, " " * len(head), head)]
    return "\n".join(lines)


# ---- schedd objects --------------------------------------------------------------------------


def fmt_schedule(schedule: object, *, short: bool = False) -> str:
    """``{"cron": "0 2 * * *", "timezone": "Europe/Berlin"}`` → ``cron 0 2 * * * (Europe/Berlin)``.

    ``short`` (for tables, next to the next-run column): no time zone, and one-off times as
    ``once``.
    """
    if schedule is None:
        return "now"
    if not isinstance(schedule, Mapping):
        return fmt_value(schedule)
    if schedule.get("cron") is not None:
        text = f"cron {fmt_value(schedule['cron'])}"
        if schedule.get("timezone") and not short:
            text += f" ({fmt_value(schedule['timezone'])})"
        return text
    if schedule.get("every") is not None:
        return f"every {fmt_seconds(schedule['every'])}"
    if schedule.get("at") is not None:
        return "once" if short else f"at {fmt_time(schedule['at'])}"
    if schedule.get("in") is not None:
        return "once" if short else f"in {fmt_seconds(schedule['in'])}"
    return fmt_value(dict(schedule)) if schedule else "now"


def _attempts(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    attempts = run.get("attempts")
    if not isinstance(attempts, list):
        return []
    return [a for a in attempts if isinstance(a, Mapping)]


def _last_attempt(run: Mapping[str, Any]) -> Mapping[str, Any] | None:
    attempts = _attempts(run)
    if not attempts:
        return None

    def number(attempt: Mapping[str, Any]) -> int:
        value = attempt.get("attempt")
        return value if isinstance(value, int) else 0

    return max(attempts, key=number)


def fmt_error(error: object) -> str:
    if isinstance(error, Mapping):
        message = error.get("message")
        kind = error.get("type") or error.get("code")
        if isinstance(message, str):
            return clean(f"{kind}: {message}" if isinstance(kind, str) else message)
    return fmt_value(error)


def _run_problem(run: Mapping[str, Any]) -> str:
    last = _last_attempt(run)
    problem = run.get("error") or (last.get("error") if last else None)
    text = fmt_error(problem) if problem else ""
    if run.get("reason"):
        text = f"{text} ({fmt_value(run['reason'])})" if text else fmt_value(run["reason"])
    if run.get("waiting"):
        text = f"{text} ({fmt_value(run['waiting'])})" if text else fmt_value(run["waiting"])
    return text


def _run_ended(run: Mapping[str, Any], style: Style = PLAIN) -> str:
    last = _last_attempt(run)
    return fmt_when(last.get("ended_at"), style) if last else "-"


def _problem_lines(run: Mapping[str, Any], width: int, indent: str) -> list[str]:
    """A run's error, reason and waiting note, each on its own wrapped lines, never cut."""
    return wrap(_run_problem(run), width, indent) if _run_problem(run) else []


def _next_run_cell(job: Mapping[str, Any], style: Style) -> str:
    """In a table: how long until the next run ("in 5h"), or its time when there is no now
    to count from; ``wide`` shows both; ``paused`` for a paused job (nothing fires)."""
    if job.get("status") == "paused":
        return "paused"
    when = job.get("next_run_at")
    rel = relative(when, style.now)
    if style.wide or not rel:
        return fmt_when(when, style)
    return rel


def _last_run_cell(job: Mapping[str, Any], style: Style) -> str:
    latest = job.get("latest_run")
    if not isinstance(latest, Mapping) or (
        latest.get("state") == "scheduled" and not latest.get("attempts")
    ):
        return "-"  # none yet: the latest is the next one, waiting for its time
    when = latest.get("updated_at")
    rel = relative(when, style.now)
    return f"{fmt_value(latest.get('state'))} {rel or fmt_time(when)}"


def _zone_of(job: Mapping[str, Any]) -> object:
    schedule = job.get("schedule")
    return schedule.get("timezone") if isinstance(schedule, Mapping) else None


def jobs_table(jobs: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> str:
    """A line per job: id, name (or task), status, schedule, when it next runs, and its latest
    run's state and age (times relative to the style's now, which a terminal shows; absolute
    without one); ``wide`` adds the task, namespace, queue, priority and the next run in the
    job's own time zone."""
    headers = ["ID", "NAME/TASK", "STATUS", "SCHEDULE", "NEXT RUN", "LAST RUN"]
    if style.wide:
        headers += ["TASK", "NAMESPACE", "QUEUE", "PRIORITY", "NEXT RUN (JOB'S ZONE)"]
    rows = []
    for j in jobs:
        row = [
            fmt_value(j.get("id")),
            fmt_value(j.get("name") or j.get("task")),
            job_status(j),
            fmt_schedule(j.get("schedule"), short=not style.wide),
            _next_run_cell(j, style),
            _last_run_cell(j, style),
        ]
        if style.wide:
            row += [fmt_value(j.get(k)) for k in ("task", "namespace", "queue", "priority")] + [
                in_zone(j.get("next_run_at"), _zone_of(j)) or "-"
            ]
        rows.append(row)
    return table(
        headers,
        rows,
        style.width,
        keep=(0, 2, 4, 5),
        drop=(3, 5, 4),
        colored=(2, 5),
        color=style.color,
    )


def submitted_table(job: Mapping[str, Any], style: Style = PLAIN) -> str:
    row = [fmt_value(job.get("id")), job_status(job), fmt_time(job.get("next_run_at"))]
    return table(
        ["ID", "STATUS", "NEXT RUN"],
        [row],
        style.width,
        keep=(0, 2),
        colored=(1,),
        color=style.color,
    )


_NOTE = "  "  # the indent of the lines under a run's row
_ERROR = "    "  # of its error


def runs_table(runs: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> str:
    """One line per run (full run id, state, attempts, last fence), then an indented line with
    when it was scheduled and ended, and its error on lines of its own, wrapped, never cut: run
    ids are too long to share a line with two times and an error in 80 columns, and a cut id
    cannot be copied."""
    width = style.width
    rows = []
    notes = []
    for run in runs:
        last = _last_attempt(run)
        rows.append(
            [
                fmt_value(run.get("id")),
                fmt_value(run.get("state")),
                str(len(_attempts(run))),
                fmt_value(last.get("fence")) if last else "-",
            ]
        )
        when = f"scheduled {fmt_when(run.get('scheduled_at'), style)}"
        if _run_ended(run) != "-":
            when += f"  ended {_run_ended(run, style)}"
        notes.append([*wrap(when, width, _NOTE), *_problem_lines(run, width, _ERROR)])
    return _with_notes(["RUN", "STATE", "ATTEMPTS", "FENCE"], rows, notes, width, style.color)


def _with_notes(
    headers: list[str],
    rows: list[list[str]],
    notes: list[list[str]],
    width: int,
    color: bool = False,
) -> str:
    """A table of runs (the id column kept whole, the state coloured), each row followed by its
    lines of notes."""
    lines = table(headers, rows, width, keep=(0,), colored=(1,), color=color).split("\n")
    out = [lines[0]]
    for line, lines_under in zip(lines[1:], notes, strict=True):
        out += [line, *lines_under]
    return "\n".join(out)


def _next_run(job: Mapping[str, Any], style: Style) -> str:
    if job.get("status") == "paused":
        return "none while paused (resume to schedule it again)"
    text = fmt_when(job.get("next_run_at"), style)
    local = in_zone(job.get("next_run_at"), _zone_of(job))
    return f"{text}; {local}" if local else text


def job_details(job: Mapping[str, Any], style: Style = PLAIN) -> str:
    pairs: list[tuple[str, str]] = []

    def add(label: str, key: str, fmt: Any = fmt_value) -> None:
        if key in job:
            pairs.append((label, fmt(job[key])))

    add("id", "id")
    add("task", "task")
    add("name", "name")
    add("namespace", "namespace")
    add("queue", "queue")
    if "status" in job:
        pairs.append(("status", job_status(job)))
    add("schedule", "schedule", fmt_schedule)
    add("policies", "schedule", fmt_policies)
    if "next_run_at" in job:
        pairs.append(("next run", _next_run(job, style)))
    add("priority", "priority")
    add("retry", "retry", fmt_retry)
    add("timeout", "timeout", fmt_seconds)
    add("heartbeat timeout", "heartbeat_timeout", fmt_seconds)
    add("depends on", "depends_on")
    add("idempotency key", "idempotency_key")
    add("created", "created_at", lambda v: fmt_when(v, style))
    add("updated", "updated_at", lambda v: fmt_when(v, style))
    add("payload", "payload")
    pairs = [(k, v) for k, v in pairs if not (k == "policies" and not v)]
    latest = job.get("latest_run")
    if isinstance(latest, Mapping):
        pairs.append(("latest run", fmt_value(latest.get("id"))))
        last = _last_attempt(latest)
        text = fmt_value(latest.get("state"))
        if last:
            text += f", attempt {fmt_value(last.get('attempt'))}"
            text += f", fence {fmt_value(last.get('fence'))}"
        rel = relative(latest.get("updated_at"), style.now)
        if rel:
            text += f", {rel}"
        pairs.append(("run state", text))
        if _run_problem(latest):
            # a waiting reason (dependencies, no worker) is not an error
            failed = latest.get("error") or (last and last.get("error"))
            ended = latest.get("state") in FINISHED_RUN_STATES
            label = "run error" if failed else "run reason" if ended else "run waits"
            pairs.append((label, _run_problem(latest)))
        pairs += [("upstream", text) for text in upstream_lines(latest)]
    elif "latest_run" in job:
        pairs.append(("latest run", "-"))
    return details(pairs, style.width, style.color)


_OPTIONS = RecurringOptions()  # the model's defaults, as the API shows them
_POLICY_DEFAULTS: dict[str, object] = {
    "jitter": _OPTIONS.jitter_ms // 1000,
    "misfire": _OPTIONS.misfire.value,
    "catchup_window": _OPTIONS.catchup_window_ms,
    "overlap": _OPTIONS.overlap.value,
    "start_at": _OPTIONS.start_at_ms,
    "end_at": _OPTIONS.end_at_ms,
}


def fmt_policies(schedule: object) -> str:
    """A recurring schedule's options that differ from the defaults, as ``overlap=queue
    misfire=run_all ...``; empty for a one-off or all defaults."""
    if not isinstance(schedule, Mapping) or (
        schedule.get("cron") is None and schedule.get("every") is None
    ):
        return ""
    parts = []
    for key, default in _POLICY_DEFAULTS.items():
        value = schedule.get(key, default)
        if value != default:
            shown = fmt_seconds(value) if key in ("jitter", "catchup_window") else fmt_value(value)
            parts.append(f"{key}={shown}")
    dst = schedule.get("dst")
    if isinstance(dst, Mapping):
        for key, default in (("gap", _OPTIONS.dst_gap), ("repeat", _OPTIONS.dst_repeat)):
            if dst.get(key, default.value) != default.value:
                parts.append(f"dst_{key}={fmt_value(dst.get(key))}")
    return " ".join(parts)


def _duration_between(start: object, end: object) -> str:
    a, b = parse_api_time(start), parse_api_time(end)
    if a is None or b is None:
        return "-"
    return format_duration(max(0, round((b - a).total_seconds() * 1000)))


def run_details(run: Mapping[str, Any], style: Style = PLAIN) -> str:
    """``schedctl run``: the run, then each attempt with its worker, fence, start, end,
    duration, outcome, progress, error and the tail of its traceback (nothing cut)."""
    width = style.width
    pairs: list[tuple[str, str]] = [
        ("run", fmt_value(run.get("id"))),
        ("job", fmt_value(run.get("job_id"))),
        *([("name", fmt_value(run["job_name"]))] if run.get("job_name") else []),
        *([("task", fmt_value(run["task"]))] if run.get("task") else []),
        ("state", fmt_value(run.get("state"))),
        ("scheduled", fmt_when(run.get("scheduled_at"), style)),
        ("due", fmt_when(run.get("due_at"), style)),
        ("updated", fmt_when(run.get("updated_at"), style)),
    ]
    for label, key in (("reason", "reason"), ("waiting", "waiting"), ("error", "error")):
        if run.get(key):
            pairs.append((label, fmt_error(run[key])))
    pairs += [("upstream", text) for text in upstream_lines(run)]
    if run.get("result") is not None:
        pairs.append(("result", fmt_value(run.get("result"))))
    out = [details(pairs, width, style.color)]
    for a in _attempts(run):
        head = (
            f"attempt {fmt_value(a.get('attempt'))}: worker {fmt_value(a.get('worker_id'))}, "
            f"fence {fmt_value(a.get('fence'))}, {fmt_value(a.get('outcome') or 'running')}"
        )
        lines = wrap(head, width)
        ended = a.get("ended_at")
        times = f"started {fmt_when(a.get('started_at'), style)}"
        if ended:
            times += (
                f", ended {fmt_time(ended)}, took {_duration_between(a.get('started_at'), ended)}"
            )
        elif a.get("deadline"):
            times += f", deadline {fmt_time(a.get('deadline'))}"
        lines += wrap(times, width, _NOTE)
        if a.get("progress") is not None:
            at = relative(a.get("progress_at"), style.now)
            lines += wrap(
                f"progress: {fmt_value(a.get('progress'))}" + (f" ({at})" if at else ""),
                width,
                _NOTE,
            )
        if a.get("error"):
            lines += wrap(f"error: {fmt_error(a.get('error'))}", width, _NOTE)
        if isinstance(a.get("traceback"), str) and a["traceback"].strip():
            lines += [_NOTE + "traceback (last lines):", *block(a["traceback"], width, _ERROR)]
        out.append("\n".join(lines))
    if not _attempts(run):
        finished = run.get("state") in FINISHED_RUN_STATES
        out.append("no attempt: it never ran" if finished else "no attempts yet")
    return "\n\n".join(out)


def upstream_lines(run: Mapping[str, Any]) -> list[str]:
    """Each upstream job a run waits for or was skipped for: its name and id, and its latest
    run's id and state (``upstream`` of the API's run view)."""
    out = []
    for up in run.get("upstream") or ():
        if not isinstance(up, Mapping):
            continue
        name = up.get("name")
        who = (
            f"{fmt_value(name)} ({fmt_value(up.get('job_id'))})"
            if name
            else fmt_value(up.get("job_id"))
        )
        if up.get("status") is None:
            out.append(f"{who}: no longer exists")
        elif up.get("run_id") is None:
            out.append(f"{who}: {fmt_value(up.get('status'))}, no run yet")
        else:
            out.append(
                f"{who}: latest run {fmt_value(up.get('run_id'))} {fmt_value(up.get('state'))}"
            )
    return out


_NODE_FIRST = ("id", "role", "healthy", "http", "raft")


LEADERS_SHOWN = 5  # the latest leader changes `schedctl cluster` lists


def _node_cell(key: str, value: object) -> str:
    if key == "last_contact" and isinstance(value, int | float):
        return f"{value:.2f}s"
    return fmt_value(value)


def cluster_view(cluster: Mapping[str, Any], style: Style = PLAIN) -> str:
    """The cluster as one node sees it: its facts, a table of the nodes, and the latest leader
    changes, one a line (``-o json`` has them all)."""
    width = style.width
    pairs = [
        (key.replace("_", " "), fmt_value(value))
        for key, value in cluster.items()
        if key not in ("nodes", "leaders", "shards")
    ]
    out = [details(pairs, width, style.color)] if pairs else []
    nodes = [n for n in cluster.get("nodes") or [] if isinstance(n, Mapping)]
    if nodes:
        keys = [k for k in _NODE_FIRST if any(k in n for n in nodes)]
        keys += [k for n in nodes for k in n if k not in keys]
        keys = list(dict.fromkeys(keys))
        rows = [[_node_cell(k, n.get(k)) for k in keys] for n in nodes]
        headers = [k.replace("_", " ").upper() for k in keys]
        out.append(table(headers, rows, width, keep=(0,)))
    shards = [x for x in cluster.get("shards") or [] if isinstance(x, Mapping)]
    if shards:
        keys = ["shard", "leader", "term", "commit_index", "applied_index", "lag"]
        rows = [[fmt_value(x.get(k)) for k in keys] for x in shards]
        out.append(table([k.replace("_", " ").upper() for k in keys], rows, width, keep=(0, 1)))
    leaders = [x for x in cluster.get("leaders") or [] if isinstance(x, Mapping)]
    if leaders:
        shown = leaders[-LEADERS_SHOWN:]
        lines = [
            f"leaders (the latest {len(shown)} of {len(leaders)}, newest last):"
            if len(leaders) > len(shown)
            else "leaders (newest last):"
        ]
        for x in shown:
            lines.append(
                f"  term {fmt_value(x.get('term'))}: {fmt_value(x.get('node'))} since "
                f"{fmt_when(x.get('at'), style)} (log index {fmt_value(x.get('index'))})"
            )
        out.append("\n".join(lines))
    return "\n\n".join(out)


def members_table(view: Mapping[str, Any], style: Style = PLAIN) -> str:
    """``schedctl node list`` (and the answer of add and remove): one row per member."""
    rows = []
    for n in view.get("nodes") or []:
        if not isinstance(n, Mapping):
            continue
        role = str(n.get("role"))
        if n.get("leader"):
            role += " (leader)"
        lag = n.get("lag")
        rows.append(
            [
                fmt_value(n.get("id")),
                fmt_value(n.get("raft")),
                role,
                "yes" if n.get("connected") else "no",
                "-" if lag is None else str(lag),
                fmt_value(n.get("http")),
            ]
        )
    headers = ["ID", "RAFT", "ROLE", "CONNECTED", "LAG", "API"]
    out = [table(headers, rows, style.width, keep=(0, 1))]
    voters = sum(1 for n in view.get("nodes") or [] if n.get("role") == "voter")
    source = "the log" if view.get("source") == "log" else "raft.peers (no change made yet)"
    out.append(
        f"{voters} voters, a majority is {view.get('quorum')}; membership from {source}"
        + (f" at index {view.get('index')}" if view.get("index") else "")
        + (f"; cluster {view.get('cluster')}" if view.get("cluster") else "")
    )
    return "\n".join(out)


def workers_table(workers: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> str:
    rows = []
    for w in workers:
        leases = w.get("leases")
        rows.append(
            [
                fmt_value(w.get("worker_id")),
                fmt_value(w.get("queues")),
                "(any)" if w.get("tasks") is None else fmt_value(w.get("tasks")),
                fmt_value(w.get("capacity")),
                str(len(leases)) if isinstance(leases, list) else fmt_value(leases),
                fmt_when(w.get("connected_at"), style),
            ]
        )
    headers = ["WORKER", "QUEUES", "TASKS", "CAPACITY", "LEASES", "CONNECTED"]
    return table(headers, rows, style.width, keep=(0, 5))


def run_job(run: Mapping[str, Any]) -> str:
    """Who a run belongs to, by name: its job's name and task (``nightly · reports.build``),
    the task alone, or the job id when the view does not say (an older node)."""
    name, task = run.get("job_name"), run.get("task")
    if name and task:
        return f"{fmt_value(name)} · {fmt_value(task)}"
    return fmt_value(name or task or run.get("job_id"))


def dlq_table(runs: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> str:
    """Dead-lettered runs: full run id (its job's id is its first part), the job's name and
    task, attempts, then an indented line with when the last attempt ended and its error on
    lines of its own, never cut (as in :func:`runs_table`)."""
    width = style.width
    rows = []
    notes = []
    for run in runs:
        rows.append([fmt_value(run.get("id")), run_job(run), str(len(_attempts(run)))])
        ended = wrap(f"ended {_run_ended(run, style)}", width, _NOTE)
        notes.append([*ended, *_problem_lines(run, width, _ERROR)])
    return _with_notes(["RUN", "NAME · TASK", "ATTEMPTS"], rows, notes, width)


def fmt_local(value: object) -> str:
    """A local time with its offset (``2026-03-29T03:00:00+02:00``) as
    ``2026-03-29 03:00:00+02:00``; anything else as it is."""
    if not isinstance(value, str):
        return fmt_value(value)
    try:
        datetime.fromisoformat(value.strip())
    except ValueError:
        return clean(value)
    text = value.strip().replace("T", " ", 1)
    head, dot, rest = text.partition(".")  # fractions of a second: never set by a schedule
    if dot:
        offset = rest.lstrip("0123456789")
        text = head + offset
    return clean(text)


_NOTE_INDENT = "    "


def fires_table(fires: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> str:
    """``explain``: scheduled time (UTC), local time and the DST or misfire note of each fire.

    Notes name times and zones and lose their meaning when cut, so when they do not fit in a
    column they go, wrapped, on indented lines under their fire."""
    width = style.width
    times = [[fmt_time(f.get("scheduled_at")), fmt_local(f.get("local"))] for f in fires]
    notes = [fmt_value(f.get("note")) if f.get("note") else "" for f in fires]
    headers = ["SCHEDULED (UTC)", "LOCAL"]
    if all(str(f.get("local", "")).endswith(("+00:00", "Z")) for f in fires):
        # in UTC the local time says nothing more
        times = [row[:1] for row in times]
        headers = headers[:1]
    cols = len(headers)
    natural = [
        max([display_width(headers[i])] + [display_width(row[i]) for row in times])
        for i in range(cols)
    ]
    keep = tuple(range(cols))
    if not any(notes):
        return table(headers, times, width, keep=keep)
    note_width = max([display_width("NOTE")] + [display_width(n) for n in notes])
    if sum(natural) + note_width + cols * len(_GAP) <= width:
        rows = [[*row, note] for row, note in zip(times, notes, strict=True)]
        return table([*headers, "NOTE"], rows, width, keep=keep)
    lines = table(headers, times, width, keep=keep).split("\n")
    out = [lines[0]]
    for line, note in zip(lines[1:], notes, strict=True):
        out.append(line)
        if note:
            out += wrap(note, width, _NOTE_INDENT)
    return "\n".join(out)


# ---- watch: a job's runs, live ---------------------------------------------------------------

FINISHED_RUN_STATES = frozenset({"succeeded", "failed", "cancelled", "skipped"})


def run_finished(run: Mapping[str, Any]) -> bool:
    return run.get("state") in FINISHED_RUN_STATES


def _watch_key(run: Mapping[str, Any]) -> tuple[object, ...]:
    """What makes a run worth a new line: its state, its attempt and fence, its error, the
    progress its worker reported."""
    last = _last_attempt(run)
    attempt = (last.get("attempt"), last.get("fence")) if last else (None, None)
    progress = orjson.dumps(last.get("progress")) if last else b"null"
    return (run.get("state"), *attempt, _run_problem(run), progress)


def watch_changes(
    previous: Sequence[Mapping[str, Any]] | None, current: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The runs of ``current`` to report, oldest first (the API lists them newest first).

    On the first poll (``previous`` is None): every unfinished run, and the newest run even if it
    has finished, rather than a job's whole history.  After that: every run that is new or whose
    state, attempt, fence or error changed.  A run that is no longer listed is not reported.
    """
    if previous is None:
        chosen = [run for i, run in enumerate(current) if i == 0 or not run_finished(run)]
    else:
        before = {str(run.get("id")): _watch_key(run) for run in previous}
        chosen = [run for run in current if before.get(str(run.get("id"))) != _watch_key(run)]
    return chosen[::-1]


def _clock(value: object) -> str:
    """``HH:MM:SS`` (UTC) of an API time; ``--:--:--`` for none."""
    text = fmt_time(value)
    if len(text) == 20 and text.endswith("Z"):
        return text[11:19]
    return "--:--:--"


_WATCH_INDENT = " " * 9  # under the run id
_STATE_WIDTH = max(len(s) for s in FINISHED_RUN_STATES | {"scheduled", "retrying"})


def watch_line(run: Mapping[str, Any], style: Style = PLAIN, *, error: bool = True) -> str:
    """``02:00:05 <run id> running   attempt 1 fence 17`` (time of the change, UTC), then, for a
    run with an error (unless ``error`` is false), indented ``error: …`` lines, never cut; and
    the latest progress a worker reported.  Fields are one space apart so that a run id (a job
    id, ``@``, milliseconds: 40 characters) fits whole in 80 columns with the rest."""
    width = style.width
    head = f"{_clock(run.get('updated_at'))} {fmt_value(run.get('id'))}"
    rest = f"{fmt_value(run.get('state')):<{_STATE_WIDTH}}"
    last = _last_attempt(run)
    if last:
        rest += f" attempt {fmt_value(last.get('attempt'))} fence {fmt_value(last.get('fence'))}"
    line = f"{head} {rest}".rstrip()
    if display_width(line) > width:  # an unusually long id: the rest goes on the next line
        line = truncate(head, width) + "\n" + truncate(_WATCH_INDENT + rest.rstrip(), width)
    problem = _run_problem(run)
    if problem and error:
        line += "\n" + "\n".join(wrap(f"error: {problem}", width, _WATCH_INDENT))
    if last and last.get("progress") is not None and not run_finished(run):
        line += "\n" + "\n".join(
            wrap(f"progress: {fmt_value(last.get('progress'))}", width, _WATCH_INDENT)
        )
    return line


def watch_lines(
    previous: Sequence[Mapping[str, Any]] | None,
    current: Sequence[Mapping[str, Any]],
    output: str = "table",
    style: Style = PLAIN,
) -> list[str]:
    """What ``schedctl watch`` prints after a poll: a line per changed run (see
    :func:`watch_changes`), or with ``-o json`` each changed run object as one JSON line.

    A run's error is shown when it first appears, not again with each later state (a run queued
    for its retry still carries the error of the attempt that failed)."""
    changed = watch_changes(previous, current)
    if output == "json":
        return [orjson.dumps(run).decode() for run in changed]
    shown = {str(run.get("id")): _run_problem(run) for run in previous or ()}
    return [
        watch_line(run, style, error=shown.get(str(run.get("id"))) != _run_problem(run))
        for run in changed
    ]
