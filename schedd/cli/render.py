"""Plain-text rendering for ``schedctl``: tables and detail views that fit an 80-column terminal.

Everything here is pure: values in, one string out.  Cells are cleaned of control characters
(a task name or an error message must not be able to move the cursor or recolour the terminal)
and cut with ``…`` when a column has to give up room.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from schedd.core.durations import format_duration

WIDTH = 80
_GAP = "  "
_MIN_COL = 3
_MIN_FLEX = 8
ELLIPSIS = "…"


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


def fmt_time(value: object) -> str:
    """An API time (RFC 3339 string, or Unix ms) as ``2026-11-25 02:00:00Z``; ``-`` for none."""
    if value is None or value == "":
        return "-"
    if isinstance(value, int | float) and not isinstance(value, bool):
        dt = datetime.fromtimestamp(value / 1000, tz=UTC)
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith(("z", "Z")):
            text = text[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            return clean(value)
        if dt.tzinfo is None:
            return clean(value)
        dt = dt.astimezone(UTC)
    else:
        return fmt_value(value)
    return dt.strftime("%Y-%m-%d %H:%M:%SZ")


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
) -> str:
    """Left-aligned columns separated by two spaces, every line at most ``width`` columns.

    ``keep`` names the columns to cut last.  If even three columns each cannot fit, the
    rightmost columns are dropped.
    """
    ncols = len(headers)
    while ncols > 1 and ncols * _MIN_COL + len(_GAP) * (ncols - 1) > width:
        ncols -= 1
    head = [clean(h) for h in headers[:ncols]]
    body = [[clean(c) for c in row[:ncols]] for row in rows]
    natural = [
        max([display_width(head[i])] + [display_width(r[i]) for r in body if i < len(r)])
        for i in range(ncols)
    ]
    widths = _fit(natural, width - len(_GAP) * (ncols - 1), keep)
    lines = []
    for row in [head, *body]:
        cells = [truncate(row[i] if i < len(row) else "", widths[i]) for i in range(ncols)]
        lines.append(_GAP.join(_pad(c, widths[i]) for i, c in enumerate(cells)).rstrip())
    return "\n".join(lines)


def details(pairs: Sequence[tuple[str, str]], width: int = WIDTH) -> str:
    """``key: value`` lines with the values aligned, each line at most ``width`` columns."""
    if not pairs:
        return ""
    keys = [clean(k) + ":" for k, _ in pairs]
    key_width = min(max(display_width(k) for k in keys), width // 3)
    lines = []
    for key, (_, value) in zip(keys, pairs, strict=True):
        key = truncate(key, key_width)
        room = width - key_width - 1
        lines.append((_pad(key, key_width) + " " + truncate(clean(value), room)).rstrip())
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


def _run_ended(run: Mapping[str, Any]) -> str:
    last = _last_attempt(run)
    return fmt_time(last.get("ended_at")) if last else "-"


def jobs_table(jobs: Sequence[Mapping[str, Any]], width: int = WIDTH) -> str:
    rows = [
        [
            fmt_value(j.get("id")),
            fmt_value(j.get("name") or j.get("task")),
            fmt_value(j.get("status")),
            fmt_schedule(j.get("schedule"), short=True),
            fmt_time(j.get("next_run_at")),
        ]
        for j in jobs
    ]
    headers = ["ID", "NAME/TASK", "STATUS", "SCHEDULE", "NEXT RUN"]
    return table(headers, rows, width, keep=(0, 2, 4))


def submitted_table(job: Mapping[str, Any], width: int = WIDTH) -> str:
    row = [fmt_value(job.get("id")), fmt_value(job.get("status")), fmt_time(job.get("next_run_at"))]
    return table(["ID", "STATUS", "NEXT RUN"], [row], width, keep=(0, 2))


def runs_table(runs: Sequence[Mapping[str, Any]], width: int = WIDTH) -> str:
    """One line per run (full run id, state, attempts, last fence), then an indented line with
    when it was scheduled and ended and its error: run ids are too long to share a line with
    two times and an error in 80 columns, and a cut id cannot be copied."""
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
        note = f"  scheduled {fmt_time(run.get('scheduled_at'))}"
        if _run_ended(run) != "-":
            note += f"  ended {_run_ended(run)}"
        if _run_problem(run):
            note += f"  {_run_problem(run)}"
        notes.append(truncate(clean(note), width))
    lines = table(["RUN", "STATE", "ATTEMPTS", "FENCE"], rows, width, keep=(0,)).split("\n")
    out = [lines[0]]
    for line, note in zip(lines[1:], notes, strict=True):
        out += [line, note]
    return "\n".join(out)


def job_details(job: Mapping[str, Any], width: int = WIDTH) -> str:
    pairs: list[tuple[str, str]] = []

    def add(label: str, key: str, fmt: Any = fmt_value) -> None:
        if key in job:
            pairs.append((label, fmt(job[key])))

    add("id", "id")
    add("task", "task")
    add("name", "name")
    add("namespace", "namespace")
    add("queue", "queue")
    add("status", "status")
    add("schedule", "schedule", fmt_schedule)
    add("next run", "next_run_at", fmt_time)
    add("priority", "priority")
    add("retry", "retry", fmt_retry)
    add("timeout", "timeout", fmt_seconds)
    add("heartbeat timeout", "heartbeat_timeout", fmt_seconds)
    add("depends on", "depends_on")
    add("idempotency key", "idempotency_key")
    add("created", "created_at", fmt_time)
    add("updated", "updated_at", fmt_time)
    add("payload", "payload")
    latest = job.get("latest_run")
    if isinstance(latest, Mapping):
        pairs.append(("latest run", fmt_value(latest.get("id"))))
        last = _last_attempt(latest)
        text = fmt_value(latest.get("state"))
        if last:
            text += f", attempt {fmt_value(last.get('attempt'))}"
            text += f", fence {fmt_value(last.get('fence'))}"
        if _run_problem(latest):
            text += f": {_run_problem(latest)}"
        pairs.append(("run state", text))
    elif "latest_run" in job:
        pairs.append(("latest run", "-"))
    return details(pairs, width)


_NODE_FIRST = ("id", "role", "healthy", "http", "raft")


def cluster_view(cluster: Mapping[str, Any], width: int = WIDTH) -> str:
    pairs = [
        (key.replace("_", " "), fmt_value(value))
        for key, value in cluster.items()
        if key != "nodes"
    ]
    out = [details(pairs, width)] if pairs else []
    nodes = [n for n in cluster.get("nodes") or [] if isinstance(n, Mapping)]
    if nodes:
        keys = [k for k in _NODE_FIRST if any(k in n for n in nodes)]
        keys += [k for n in nodes for k in n if k not in keys]
        keys = list(dict.fromkeys(keys))
        rows = [[fmt_value(n.get(k)) for k in keys] for n in nodes]
        headers = [k.replace("_", " ").upper() for k in keys]
        out.append(table(headers, rows, width, keep=(0,)))
    return "\n\n".join(out)


def workers_table(workers: Sequence[Mapping[str, Any]], width: int = WIDTH) -> str:
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
                fmt_time(w.get("connected_at")),
            ]
        )
    headers = ["WORKER", "QUEUES", "TASKS", "CAPACITY", "LEASES", "CONNECTED"]
    return table(headers, rows, width, keep=(0, 5))


def dlq_table(runs: Sequence[Mapping[str, Any]], width: int = WIDTH) -> str:
    """Dead-lettered runs: full run id, job, attempts, then an indented line with when the last
    attempt ended and its error (the run id alone takes half the width, as in :func:`runs_table`)."""
    rows = []
    notes = []
    for run in runs:
        rows.append(
            [fmt_value(run.get("id")), fmt_value(run.get("job_id")), str(len(_attempts(run)))]
        )
        note = f"  ended {_run_ended(run)}"
        if _run_problem(run):
            note += f"  {_run_problem(run)}"
        notes.append(truncate(clean(note), width))
    lines = table(["RUN", "JOB", "ATTEMPTS"], rows, width, keep=(0,)).split("\n")
    out = [lines[0]]
    for line, note in zip(lines[1:], notes, strict=True):
        out += [line, note]
    return "\n".join(out)


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


def fires_table(fires: Sequence[Mapping[str, Any]], width: int = WIDTH) -> str:
    """``explain``: scheduled time (UTC), local time and the DST or misfire note of each fire.

    Notes name times and zones and lose their meaning when cut, so when they do not fit in a
    column they go, wrapped, on indented lines under their fire."""
    import textwrap

    times = [[fmt_time(f.get("scheduled_at")), fmt_local(f.get("local"))] for f in fires]
    notes = [fmt_value(f.get("note")) if f.get("note") else "" for f in fires]
    headers = ["SCHEDULED (UTC)", "LOCAL"]
    natural = [
        max([display_width(headers[i])] + [display_width(row[i]) for row in times])
        for i in range(2)
    ]
    if not any(notes):
        return table(headers, times, width, keep=(0, 1))
    note_width = max([display_width("NOTE")] + [display_width(n) for n in notes])
    if sum(natural) + note_width + 2 * len(_GAP) <= width:
        rows = [[*row, note] for row, note in zip(times, notes, strict=True)]
        return table([*headers, "NOTE"], rows, width, keep=(0, 1))
    lines = table(headers, times, width, keep=(0, 1)).split("\n")
    out = [lines[0]]
    room = max(width - len(_NOTE_INDENT), 20)
    for line, note in zip(lines[1:], notes, strict=True):
        out.append(line)
        for part in textwrap.wrap(note, room, break_on_hyphens=False):
            out.append(truncate(_NOTE_INDENT + part, width))
    return "\n".join(out)


# ---- watch: a job's runs, live ---------------------------------------------------------------

FINISHED_RUN_STATES = frozenset({"succeeded", "failed", "cancelled", "skipped"})


def run_finished(run: Mapping[str, Any]) -> bool:
    return run.get("state") in FINISHED_RUN_STATES


def _watch_key(run: Mapping[str, Any]) -> tuple[object, ...]:
    """What makes a run worth a new line: its state, its attempt and fence, its error."""
    last = _last_attempt(run)
    attempt = (last.get("attempt"), last.get("fence")) if last else (None, None)
    return (run.get("state"), *attempt, _run_problem(run))


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


def watch_line(run: Mapping[str, Any], width: int = WIDTH, *, error: bool = True) -> str:
    """``02:00:05 <run id> running   attempt 1 fence 17`` (time of the change, UTC), then, for a
    run with an error (unless ``error`` is false), an indented ``error: …`` line.  Fields are one
    space apart so that a run id (a job id, ``@``, milliseconds: 40 characters) fits whole in 80
    columns with the rest."""
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
        line += "\n" + truncate(clean(f"{_WATCH_INDENT}error: {problem}"), width)
    return line


def watch_lines(
    previous: Sequence[Mapping[str, Any]] | None,
    current: Sequence[Mapping[str, Any]],
    output: str = "table",
    width: int = WIDTH,
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
        watch_line(run, width, error=shown.get(str(run.get("id"))) != _run_problem(run))
        for run in changed
    ]
