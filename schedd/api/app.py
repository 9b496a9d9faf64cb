"""The HTTP JSON API (aiohttp): thin handlers over the node's ports (:mod:`schedd.api.ports`),
one error table."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

import schedd
from schedd import clock
from schedd.api.cluster import cluster_view
from schedd.api.events import events
from schedd.api.members import add_node, cluster_nodes, join_cluster, remove_node
from schedd.api.openapi import openapi_json
from schedd.api.operations import (
    BY_ID,
    COUNT,
    CURSOR,
    LIMIT,
    MINUTES,
    OPERATIONS,
    PUBLIC_PATHS,
    IntQuery,
)
from schedd.api.ports import (
    CONFIG,
    LEADER_WORKERS,
    LOGIN_CODES,
    METRICS,
    NODE,
    PREFIX,
    PROXY,
    RAFT,
    RATE_LIMITS,
    READER,
    TOKEN,
    TOKENS,
    Ports,
    Raft,
    error_response,
    install,
    json_response,
    read_json,
    require,
)
from schedd.api.snapshot import SAVES, Saves, snapshot
from schedd.api.views import (
    BatchResultView,
    DlqBulkView,
    ExplainView,
    HealthView,
    JobListView,
    LoginCodeView,
    ReadyView,
    RunListView,
    RunView,
    SchedulingLagView,
    SessionView,
    WhoamiView,
    WorkersView,
    WorkerView,
    job_view,
    lag_view,
    run_view,
    waiting_reason,
    worker_view,
)
from schedd.api.ws import worker_connect
from schedd.auth import ACTIONS, SESSION_PREFIX, Role
from schedd.config import Config
from schedd.core import commands
from schedd.core.durations import format_time, parse_time
from schedd.core.model import JobSpec, JobStatus, RunState
from schedd.core.recurrence import explain, recurrence_from
from schedd.core.runs import MISFIRE_GRACE_MS, is_recurring, recurrence
from schedd.core.state import Counted, Ok, Rejected, Result, counts_of
from schedd.core.validate import (
    Defaults,
    parse_batch,
    parse_dlq_bulk,
    parse_ident,
    parse_job,
    parse_patch,
    parse_schedule,
    parse_text,
)
from schedd.errors import (
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
    SchedError,
    Unavailable,
    from_code,
)
from schedd.ids import could_be_job_id_prefix, is_job_id, new_job_id, new_request_id
from schedd.logs import log_event
from schedd.storage.reader import MAX_IDS
from schedd.storage.schema import FIRST
from schedd.ui import mount as mount_ui

log = logging.getLogger(__name__)

WRITE_DEADLINE_S = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SchedError as err:
        return error_response(err)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(PayloadTooLarge(f"request body over the limit ({exc.text})"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: NotFound, 405: InvalidArgument}.get(exc.status, InvalidArgument)
        message = f"{request.method} {request.path}: {exc.reason}"
        headers = None
        if exc.status == 404:
            message = f"no route for {request.method} {request.path}"
        elif isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            message = (
                f"{request.method} is not allowed on {request.path}; expected one of {allowed}"
            )
            headers = {"Allow": allowed}
        return json_response(code(message).to_dict(), exc.status, headers)
    except asyncio.CancelledError:
        raise
    except Exception:  # never a stack trace in a response
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_response({"error": {"code": "internal", "message": "internal error"}}, 500)


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    request.app[METRICS].api_latency.labels(name, request.method, str(response.status)).observe(
        time.perf_counter() - started
    )
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS:
        return await handler(request)
    token = request.app[TOKENS].authenticate(request.headers.get("Authorization"))
    request[TOKEN] = token
    return await handler(request)


async def request_id(request: web.Request) -> str:
    """The client's ``X-Request-Id`` (scoped to its token and to this exact request), or a
    fresh one.

    Commands are deduplicated by request id, so a client that repeats a write after a lost reply
    (on this node or another) gets the first result instead of a second job.  The id covers the
    method, path and body too: the same id on a different request is a different request.
    """
    given = request.headers.get("X-Request-Id")
    if given is None:
        return new_request_id()
    if not 8 <= len(given) <= 128 or not given.isascii() or not given.isprintable():
        raise InvalidArgument(
            "X-Request-Id: expected 8 to 128 printable ASCII characters", field="X-Request-Id"
        )
    digest = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    digest.update(await request.read())
    return f"{request[TOKEN].name}:{given}:{digest.hexdigest()[:24]}"


async def commit(
    raft: Raft, make: Callable[[str, int], commands.Command], rid: str | None = None
) -> Result:
    """Commit a client command, retrying with the same request id across elections."""
    rid = rid or new_request_id()
    now = clock.wall_ms()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WRITE_DEADLINE_S
    delay = 0.05
    while True:
        try:
            return await raft.submit(
                make(rid, now), timeout=max(0.1, min(3.0, deadline - loop.time()))
            )
        except Unavailable:
            if loop.time() + delay >= deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


def unwrap(res: Result) -> Any:
    if isinstance(res, Rejected):
        raise from_code(res.code, res.message, res.field)
    assert isinstance(res, Ok)
    return res.value


def defaults(config: Config) -> Defaults:
    s = config.scheduler
    return Defaults(
        max_attempts=s.default_max_attempts,
        heartbeat_timeout_ms=s.heartbeat_timeout_ms,
        max_payload=s.max_payload,
    )


# -- jobs ---------------------------------------------------------------------------------------


def check_rate(app: web.Application, specs: list[Any], now: int) -> None:
    """Per-namespace submission rate limits: 429 with Retry-After when over."""
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.namespace] = counts.get(spec.namespace, 0) + 1
    for ns, n in counts.items():
        bucket = app[RATE_LIMITS].get(ns)
        if bucket is None:
            continue
        wait = bucket.take(now, n)
        if wait == float("inf"):
            raise InvalidArgument(
                f"namespace {ns}: {n} jobs at once is more than its burst "
                f"({app[CONFIG].limits.submit_burst}); expected smaller batches",
                field="jobs",
            )
        if wait > 0:
            raise ResourceExhausted(
                f"namespace {ns} is over its submission rate; retry in {wait:.1f}s",
                retry_after=math.ceil(wait),
            )


async def submit_job(request: web.Request) -> web.Response:
    app = request.app
    body = await read_json(request)
    now = clock.wall_ms()
    spec = parse_job(body, now_ms=now, defaults=defaults(app[CONFIG]))
    check_rate(app, [spec], now)
    job_id = new_job_id(now)
    res = await commit(
        app[RAFT],
        lambda rid, t: commands.Submit(rid, t, ((job_id, spec),)),
        await request_id(request),
    )
    [(job, created, latest)] = unwrap(res)  # the job and its latest run, as applied
    view = job_view(job, latest)
    if created and (warning := await _nobody_serves(request, spec)) is not None:
        view["warnings"] = [warning]
    log_event(
        log, "job.submitted", level=logging.DEBUG, job_id=job.id, task=spec.task, created=created
    )
    return json_response(view, 201 if created else 200)


async def submit_batch(request: web.Request) -> web.Response:
    app = request.app
    body = await read_json(request)
    now = clock.wall_ms()
    refs = _take_refs(body)
    specs = parse_batch(
        body, now_ms=now, defaults=defaults(app[CONFIG]), max_jobs=app[CONFIG].limits.max_batch
    )
    check_rate(app, specs, now)
    ids = [new_job_id(now) for _ in specs]
    by_ref = {ref: ids[i] for i, ref in enumerate(refs) if ref is not None}
    jobs = tuple(
        (job_id, replace(spec, depends_on=tuple(by_ref.get(d, d) for d in spec.depends_on)))
        for job_id, spec in zip(ids, specs, strict=True)
    )
    res = await commit(
        app[RAFT], lambda rid, t: commands.Submit(rid, t, jobs), await request_id(request)
    )
    if isinstance(res, Rejected) and by_ref:  # name the batch's own jobs by their refs
        message = res.message
        for ref, job_id in by_ref.items():
            message = message.replace(job_id, ref)
        res = Rejected(res.code, message, res.field)
    batch: BatchResultView = {"jobs": [job_view(job, latest) for job, _, latest in unwrap(res)]}
    return json_response(batch, 201)


def _take_refs(body: Any) -> list[str | None]:
    """Pop each batch item's optional ``ref``: a name other items of the same batch can use in
    ``depends_on`` (the server assigns job ids), so a whole graph goes in one request."""
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
        return []
    refs: list[str | None] = []
    for i, item in enumerate(body["jobs"]):
        ref = item.pop("ref", None) if isinstance(item, dict) else None
        if ref is not None and (not isinstance(ref, str) or not 1 <= len(ref) <= 200):
            raise InvalidArgument(
                f"jobs[{i}].ref: expected a name of 1 to 200 characters", field=f"jobs[{i}].ref"
            )
        if ref is not None and ref in refs:
            raise InvalidArgument(
                f"jobs[{i}].ref: {ref!r} is used twice in this batch", field=f"jobs[{i}].ref"
            )
        refs.append(ref)
    return refs


def _int_param(request: web.Request, param: IntQuery) -> int:
    """The query parameter ``param`` (declared with its bounds in the operation table)."""
    name, lo, hi = param.name, param.lo, param.hi
    raw = request.query.get(name)
    if raw is None:
        assert param.default is not None
        return param.default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(
            f"{name}: expected an integer from {lo} to {hi}, got {raw!r}", field=name
        ) from None
    if not lo <= value <= hi:
        raise InvalidArgument(
            f"{name}: expected an integer from {lo} to {hi}, got {value}", field=name
        )
    return value


def _page(request: web.Request, first: int) -> tuple[int, int]:
    """A listing's ``limit`` and ``cursor`` (a previous page's ``next_cursor``; ``first``
    without one), as the operation table declares them."""
    limit = _int_param(request, LIMIT)
    raw = request.query.get("cursor")
    if raw is None:
        return limit, first
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) <= CURSOR.hi):
        raise InvalidArgument(
            f"cursor: expected the next_cursor of a previous page (digits), got {raw!r}",
            field="cursor",
        )
    return limit, int(raw)


def _cursor(after: int | None) -> str | None:
    return None if after is None else str(after)


def _choice(request: web.Request, name: str, allowed: type[StrEnum]) -> str | None:
    value = request.query.get(name)
    if value is not None and value not in set(allowed):
        raise InvalidArgument(
            f"{name}: expected one of {', '.join(allowed)}, got {value!r}", field=name
        )
    return value


_FROM_BEFORE_MS = 7_258_118_400_000  # 2200-01-01T00:00:00Z


def _from(request: web.Request) -> int | None:
    """``from``: explain the fire times after this instant instead of after now."""
    raw = request.query.get("from")
    if raw is None:
        return None
    ms = parse_time(raw, "from")
    if not 0 <= ms < _FROM_BEFORE_MS:
        raise InvalidArgument(
            f"from: expected a time from 1970-01-01 to 2199-12-31, got {raw!r}", field="from"
        )
    return ms


def _since(request: web.Request) -> int | None:
    raw = request.query.get("since")
    return None if raw is None else parse_time(raw, "since")


async def list_jobs(request: web.Request) -> web.Response:
    app = request.app
    limit, cursor = _page(request, 0)
    q = request.query
    filters = {k: q[k] for k in ("namespace", "queue", "task", "name") if k in q}
    for key in ("namespace", "queue"):
        if key in filters:
            parse_ident(filters[key], key)
    for key, enum in (("status", JobStatus), ("last_run", RunState)):
        if (value := _choice(request, key, enum)) is not None:
            filters[key] = value
    if "id_prefix" in q:
        prefix = q["id_prefix"].upper()
        if not could_be_job_id_prefix(prefix):
            raise InvalidArgument(
                f"id_prefix: expected the first 1 to 26 characters of a job id (digits and "
                f"letters but I, L, O, U), got {q['id_prefix']!r}",
                field="id_prefix",
            )
        filters["id_prefix"] = prefix
    if "ids" in q:
        ids = q["ids"].upper().split(",")
        if not 1 <= len(ids) <= MAX_IDS or not all(is_job_id(i) for i in ids):
            raise InvalidArgument(
                f"ids: expected 1 to {MAX_IDS} job ids, comma-separated, got {q['ids'][:80]!r}",
                field="ids",
            )
        filters["ids"] = ",".join(ids)
    jobs, after = await app[READER].jobs_page(cursor, limit, filters)
    latest = await app[READER].latest_runs([job.id for job in jobs])
    body: JobListView = {
        "jobs": [job_view(job, latest.get(job.id)) for job in jobs],
        "next_cursor": _cursor(after),
    }
    return json_response(body)


def _job_id(request: web.Request) -> str:
    return request.match_info["job_id"]


async def get_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = _job_id(request)
    job = await app[READER].job(job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    view = job_view(job, await app[READER].latest_run(job_id))
    if view["latest_run"] is not None:
        await _explain_waiting(request, [view["latest_run"]], job.spec)
    return json_response(view)


async def cancel_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = _job_id(request)
    unwrap(
        await commit(
            app[RAFT], lambda rid, t: commands.CancelJob(rid, t, job_id), await request_id(request)
        )
    )
    log_event(log, "job.cancelled", job_id=job_id)
    return web.Response(status=204)


async def update_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = _job_id(request)
    body = await read_json(request)
    now = clock.wall_ms()
    current = await app[READER].job(job_id)
    if current is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    paused, spec = parse_patch(body, current.spec, now_ms=now, defaults=defaults(app[CONFIG]))
    res = await commit(
        app[RAFT],
        lambda rid, t: commands.UpdateJob(rid, t, job_id, paused, spec),
        await request_id(request),
    )
    job = unwrap(res)
    view = job_view(await app[READER].job(job.id) or job, await app[READER].latest_run(job.id))
    log_event(log, "job.updated", job_id=job_id, paused=paused, spec_changed=spec is not None)
    return json_response(view)


async def trigger_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = _job_id(request)
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict) or set(body) - {"overlap"}:
        raise InvalidArgument('expected {"overlap": "respect"} or {"overlap": "override"}')
    overlap = body.get("overlap", "respect")
    if overlap not in ("respect", "override"):
        raise InvalidArgument(
            f'overlap: expected "respect" or "override", got {overlap!r}', field="overlap"
        )
    res = await commit(
        app[RAFT],
        lambda rid, t: commands.Trigger(rid, t, job_id, overlap == "override"),
        await request_id(request),
    )
    run = unwrap(res)
    view = run_view(await app[READER].run(run.id) or run)
    log_event(log, "job.triggered", job_id=job_id, run_id=run.id, overlap=overlap)
    return json_response(view, 201)


async def _run_command(
    request: web.Request,
    make: Callable[[str, int, str], commands.Command],
    event: str,
    reply: bool = True,
) -> web.Response:
    """A client command about one run (cancel, replay, drop): commit, log, answer."""
    app = request.app
    run_id = request.match_info["run_id"]
    unwrap(await commit(app[RAFT], lambda rid, t: make(rid, t, run_id), await request_id(request)))
    log_event(log, event, run_id=run_id)
    if not reply:
        return web.Response(status=204)
    run = await app[READER].run(run_id)
    if run is None:  # committed, so it exists: only a snapshot install in between could hide it
        raise NotFound(f"no run with id {run_id}", field="run_id")
    return json_response(run_view(run))


async def cancel_run(request: web.Request) -> web.Response:
    return await _run_command(request, commands.CancelRun, "run.cancelled")


async def replay_dead(request: web.Request) -> web.Response:
    return await _run_command(request, commands.Replay, "dlq.replayed")


async def drop_dead(request: web.Request) -> web.Response:
    return await _run_command(request, commands.DropDead, "dlq.dropped", reply=False)


def _fires_view(fires: list[dict[str, Any]]) -> ExplainView:
    return {
        "fires": [
            {
                "scheduled_at": format_time(int(f["scheduled_ms"])),
                "due_at": format_time(int(f["due_ms"])),
                "local": f["local"],
                "note": f["note"],
            }
            for f in fires
        ]
    }


async def explain_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = _job_id(request)
    count = _int_param(request, COUNT)
    start = _from(request)
    job = await app[READER].job(job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    if not is_recurring(job.spec):
        at = job.next_run_at_ms
        one: list[dict[str, Any]] = (
            []
            if at is None
            else [{"scheduled_ms": at, "due_ms": at, "local": format_time(at), "note": "one-off"}]
        )
        return json_response(_fires_view(one))
    now = clock.wall_ms()
    fires: list[dict[str, Any]] = explain(
        recurrence(job), now if start is None else start, count, job.id
    )
    if start is not None:  # the times after another instant: now's state does not apply
        return json_response(_fires_view(fires))
    pending = await app[READER].run(job.next_run_id) if job.next_run_id else None
    if pending is not None and now - pending.scheduled_ms > MISFIRE_GRACE_MS:
        opts = job.spec.schedule.options
        policy = opts.misfire.value if opts else "run_once"
        fires.insert(
            0,
            {
                "scheduled_ms": pending.scheduled_ms,
                "due_ms": pending.due_ms,
                "local": format_time(pending.scheduled_ms),
                "note": f"missed (more than {MISFIRE_GRACE_MS // 1000}s late): the "
                f"misfire policy {policy} decides whether it and the "
                f"occurrences since run when it fires",
            },
        )
    elif job.status is JobStatus.PAUSED:
        fires = [
            dict(
                f,
                note=(f["note"] + "; " if f["note"] else "") + "job paused: occurrences "
                "missed while paused are handled by its misfire policy on resume",
            )
            for f in fires
        ]
    return json_response(_fires_view(fires[:count]))


async def explain_expr(request: web.Request) -> web.Response:
    count = _int_param(request, COUNT)
    q = request.query
    schedule: dict[str, Any] = {k: q[k] for k in ("cron", "every", "timezone", "jitter") if k in q}
    dst = {k: q[f"dst_{k}"] for k in ("gap", "repeat") if f"dst_{k}" in q}
    if dst:
        schedule["dst"] = dst
    if "cron" not in schedule and "every" not in schedule:
        raise InvalidArgument(
            "expected a cron=EXPR (and optionally timezone=ZONE) or every=DUR query parameter",
            field="cron",
        )
    start = _from(request)
    now = clock.wall_ms() if start is None else start
    parsed, options = parse_schedule(schedule, now, "schedule")
    assert options is not None
    fires = explain(recurrence_from(parsed, options, now), now, count, "explain")
    return json_response(_fires_view(fires))


async def job_runs(request: web.Request) -> web.Response:
    app = request.app
    job_id = _job_id(request)
    job = await app[READER].job(job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    limit, before = _page(request, FIRST)
    state = _choice(request, "state", RunState)
    runs, after = await app[READER].runs_page(
        job_id, before, limit, None if state is None else RunState(state), _since(request)
    )
    body: RunListView = {"runs": [run_view(r) for r in runs], "next_cursor": _cursor(after)}
    await _explain_waiting(request, body["runs"], job.spec)
    return json_response(body)


async def get_run(request: web.Request) -> web.Response:
    app = request.app
    run_id = request.match_info["run_id"]
    run = await app[READER].run(run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id}", field="run_id")
    view = run_view(run)
    job = await app[READER].job(run.job_id) if run.state is RunState.QUEUED else None
    if job is not None:
        await _explain_waiting(request, [view], job.spec)
    return json_response(view)


async def _nobody_serves(request: web.Request, spec: JobSpec) -> str | None:
    """What a submit warns of: no connected worker would take the job's runs (None when one
    would, or when the leader's workers cannot be asked)."""
    try:
        workers = await _connected_workers(request, recent=True)
    except SchedError:
        return None
    return waiting_reason(spec.task, spec.queue, workers)


async def _explain_waiting(request: web.Request, views: list[RunView], spec: JobSpec) -> None:
    """Say in each queued run's view why no worker takes it, from the workers connected to the
    leader (asked of it from a follower; left unsaid when it cannot be asked)."""
    if not any(v["state"] == RunState.QUEUED.value for v in views):
        return
    try:
        workers = await _connected_workers(request, recent=True)
    except SchedError:
        return
    for view in views:
        if view["state"] == RunState.QUEUED.value:
            view["waiting"] = waiting_reason(spec.task, spec.queue, workers)


async def list_dlq(request: web.Request) -> web.Response:
    app = request.app
    limit, before = _page(request, FIRST)
    q = request.query
    filters: dict[str, str | int] = {k: q[k] for k in ("namespace", "queue", "task") if k in q}
    for key in ("namespace", "queue"):
        if key in filters:
            parse_ident(q[key], key)
    if (since := _since(request)) is not None:
        filters["since"] = since
    if "error" in q:
        filters["error"] = parse_text(q["error"], "error")
    runs, after = await app[READER].dead_letters_page(before, limit, filters)
    body: RunListView = {
        "runs": [run_view(r) for r in runs if r.state is RunState.FAILED],
        "next_cursor": _cursor(after),
    }
    return json_response(body)


async def _dead_letters(request: web.Request, action: str) -> web.Response:
    """``POST /dlq/replay`` and ``/dlq/drop``: resolve the selection to run ids here (as this
    node's reads show the queue), then commit the list as one command.  Committing ids, not the
    filter, keeps apply short on every node (a filter would scan the whole queue there, under
    the Raft apply) and acts on what a dry run showed."""
    app = request.app
    limit = app[CONFIG].limits.max_bulk
    selection = parse_dlq_bulk(await read_json(request), max_runs=limit)
    rid = await request_id(request)  # (checked for a dry run too)
    skipped: list[str] = []
    if selection.run_ids is not None:
        named = await app[READER].dead_letters_named(list(selection.run_ids))
        found = [(run_id, named[run_id]) for run_id in selection.run_ids if run_id in named]
        skipped = [run_id for run_id in selection.run_ids if run_id not in named]
    else:
        found = await app[READER].dead_letters_matching(selection.filters, limit + 1)
        if len(found) > limit:
            raise InvalidArgument(
                f"more than {limit:,} runs of the dead-letter queue match (limits.max_bulk): "
                f"expected a narrower filter (namespace, queue, task, since, error), or "
                f"{action} them in parts"
            )
    if selection.dry_run:
        tasks: dict[str, int] = {}
        for _, task in found:
            tasks[task] = tasks.get(task, 0) + 1
        return json_response(
            _bulk_view(action, True, [r for r, _ in found], skipped, sorted(tasks.items()))
        )
    ids = tuple(run_id for run_id, _ in found)
    res = await commit(
        app[RAFT],
        lambda rid, t: commands.DeadLetters(rid, t, action, ids),
        rid,
    )
    done, gone, by_task = unwrap(res)
    log_event(log, f"dlq.{action}_many", count=len(done), skipped=len(gone) + len(skipped))
    return json_response(
        _bulk_view(action, False, done, [*skipped, *gone], [(t, n) for t, n in by_task])
    )


def _bulk_view(
    action: str, dry_run: bool, run_ids: list[str], skipped: list[str], tasks: list[tuple[str, int]]
) -> DlqBulkView:
    ranked = sorted(tasks, key=lambda tn: (-tn[1], tn[0]))
    n, k = len(run_ids), len(ranked)
    verb = action if dry_run else {"replay": "replayed", "drop": "dropped"}[action]
    message = f"{verb} {n:,} run{'s' * (n != 1)} of {k:,} task{'s' * (k != 1)}"
    if skipped:
        message += f"; {len(skipped):,} skipped (not in the dead-letter queue)"
    return {
        "action": "replay" if action == "replay" else "drop",
        "dry_run": dry_run,
        "count": n,
        "tasks": [{"task": t, "count": c} for t, c in ranked],
        "run_ids": run_ids,
        "skipped": skipped,
        "message": message,
    }


async def replay_dead_letters(request: web.Request) -> web.Response:
    return await _dead_letters(request, "replay")


async def drop_dead_letters(request: web.Request) -> web.Response:
    return await _dead_letters(request, "drop")


# -- cluster --------------------------------------------------------------------------------------


async def cluster(request: web.Request) -> web.Response:
    app = request.app
    config = app[CONFIG]
    versions = app[PROXY].versions([url for url in config.peer_http_urls()])
    return json_response(cluster_view(config, app[RAFT], app[NODE].leader_url(), versions))


async def workers(request: web.Request) -> web.Response:
    body: WorkersView = {"workers": await _connected_workers(request)}
    return json_response(body)


async def scheduling_lag(request: web.Request) -> web.Response:
    """The leader's lag windows (``Metrics.fire_window``, ``lease_window``) and what waits now,
    with ``samples=true`` each observation too (``Metrics.fire_samples``, ``lease_samples``); a
    follower asks the leader, where the observations are."""
    minutes = _int_param(request, MINUTES)
    raw = request.query.get("samples", "false")
    if raw not in ("true", "false"):
        raise InvalidArgument(f"samples: expected true or false, got {raw!r}", field="samples")
    samples = raw == "true"
    leader = request.app[NODE].leader
    if leader is None or not leader.ready.is_set():
        path = f"{PREFIX}/scheduling-lag?minutes={minutes}" + "&samples=true" * samples
        return json_response(await request.app[PROXY].get(request, path))
    app = request.app
    window, now, wall = minutes * 60.0, clock.mono(), clock.wall_ms()
    queued, overdue = await app[READER].due_not_leased(wall)
    with app[RAFT].read() as st:
        skipped = counts_of(st.counts, Counted.SKIPPED)
    metrics = app[METRICS]
    body: SchedulingLagView = {
        "leader": app[CONFIG].node.id,
        "window": window if window % 1 else int(window),
        "fire": lag_view(metrics.fire_window.counts(window, now), metrics.fire_window.bounds),
        "lease": lag_view(metrics.lease_window.counts(window, now), metrics.lease_window.bounds),
        "due_not_leased": queued + overdue,
        "queued": queued,
        "overdue": overdue,
        "misfires": skipped.get("misfire", 0),
        "skipped": [{"reason": r, "count": n} for r, n in sorted(skipped.items()) if n],
    }
    if samples:
        fire, lease = (
            [list(s) for s in ring.recent(window, now, wall)]
            for ring in (metrics.fire_samples, metrics.lease_samples)
        )
        body["samples"] = {"fire": fire, "lease": lease}
    return json_response(body)


async def drain_worker(request: web.Request) -> web.Response:
    """The leader leases the worker nothing more and tells it to drain; a follower asks the
    leader (the worker is connected there)."""
    worker_id = request.match_info["worker_id"]
    leader = request.app[NODE].leader
    if leader is None or not leader.ready.is_set():
        answer = await request.app[PROXY].post(
            request, f"{PREFIX}/workers/{quote(worker_id)}/drain"
        )
        return json_response(answer)
    conn = leader.drain(worker_id)
    if conn is None:
        raise NotFound(
            f"no worker with id {worker_id!r} is connected to the leader", field="worker_id"
        )
    log_event(log, "worker.drained_by_api", worker_id=worker_id, by=request[TOKEN].name)
    return json_response(worker_view(conn))


LEADER_WORKERS_FRESH_S = 1.0  # how long a follower answers from the leader's last list


async def _connected_workers(request: web.Request, recent: bool = False) -> list[WorkerView]:
    """The workers connected to the leader: this node's own when it leads, else the leader's
    answer to ``GET /workers`` (``Unavailable`` when it cannot be asked).  ``recent``: a
    follower may answer from the leader's list of the last second (what a submit's warning and
    a page's waiting reasons want, not ``GET /workers`` itself)."""
    leader = request.app[NODE].leader
    if leader is not None and leader.ready.is_set():
        return [worker_view(w) for w in leader.workers.values()]
    seen = request.app[LEADER_WORKERS]
    if recent and time.monotonic() - seen.at < LEADER_WORKERS_FRESH_S:
        kept: list[WorkerView] = seen.value
        return kept
    answer = await request.app[PROXY].get(request, f"{PREFIX}/workers")
    if not isinstance(answer, dict) or not isinstance(answer.get("workers"), list):
        raise Unavailable("the leader's answer to GET /workers has no workers list")
    workers: list[WorkerView] = answer["workers"]
    seen.at, seen.value = time.monotonic(), workers
    return workers


async def whoami(request: web.Request) -> web.Response:
    token = request[TOKEN]
    actions = sorted(action for action, roles in ACTIONS.items() if token.role in roles)
    body: WhoamiView = {
        "name": token.name,
        "role": token.role.value,
        "actions": actions,
        "operations": sorted(
            op.op_id for op in OPERATIONS if op.action is None or op.action in actions
        ),
    }
    return json_response(body)


async def create_login_code(request: web.Request) -> web.Response:
    body = await read_json(request) if request.can_read_body else {}
    if not isinstance(body, dict) or body.keys() - {"read_only"}:
        raise InvalidArgument(
            "body: expected an object with at most read_only (true or false)", field="body"
        )
    read_only = body.get("read_only", False)
    if not isinstance(read_only, bool):
        raise InvalidArgument(
            f"read_only: expected true or false, got {json.dumps(read_only)}",
            field="read_only",
        )
    if (
        request.headers.get("Authorization", "")
        .partition(" ")[2]
        .strip()
        .startswith(SESSION_PREFIX)
    ):  # else a session could renew itself for ever
        raise PermissionDenied(
            "a dashboard session cannot open another: ask with a token of the tokens file"
        )
    codes = request.app[LOGIN_CODES]
    code = codes.issue(request[TOKEN], read_only)
    view: LoginCodeView = {
        "code": code,
        "expires_at": format_time(clock.wall_ms() + int(codes.ttl_s * 1000)),
        "path": f"/ui/#code={code}",
    }
    return json_response(view, status=201)


async def login(request: web.Request) -> web.Response:
    body = await read_json(request)
    code = body.get("code") if isinstance(body, dict) else None
    if not isinstance(code, str) or not 1 <= len(code) <= 100 or len(body) != 1:
        raise InvalidArgument(
            "code: required; expected the one-time code schedctl ui put in the page's "
            "address (#code=…)",
            field="code",
        )
    token, read_only = request.app[LOGIN_CODES].take(code)
    expires_ms = clock.wall_ms() + request.app[CONFIG].auth.ui_session_ttl_ms
    secret = request.app[TOKENS].session(token, expires_ms // 1000, read_only)
    view: SessionView = {
        "token": secret,
        "name": token.name,
        "role": (Role.READ if read_only else token.role).value,
        "expires_at": format_time(expires_ms // 1000 * 1000),
    }
    return json_response(view)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    body: HealthView = {
        "status": "ok",
        "node_id": request.app[CONFIG].node.id,
        "version": schedd.__version__,
    }
    return json_response(body)


async def readyz(request: web.Request) -> web.Response:
    raft = request.app[RAFT]
    leader = raft.leader_addr
    if request.app[NODE].draining:
        raise Unavailable("not ready: this node is shutting down", retry_after=1)
    if leader is None or not raft.is_ready():
        raise Unavailable("not ready: no known leader yet", retry_after=1)
    own = request.app[NODE].leader
    if raft.is_leader and (own is None or not own.ready.is_set()):
        # elected, but what only the leader serves (workers, dispatch) is not there yet
        raise Unavailable("not ready: this node was just elected and is starting", retry_after=1)
    body: ReadyView = {"status": "ready", "leader": leader}
    return json_response(body)


def make_app(ports: Ports) -> web.Application:
    app = web.Application(
        middlewares=[metrics_middleware, errors_middleware, auth_middleware],
        client_max_size=ports.config.http.max_body,
    )
    install(app, ports)
    app[SAVES] = Saves()
    mount_ui(app)  # the dashboard at /ui/ (its files need no token)
    handlers = {h.__name__: h for h in HANDLERS}
    assert handlers.keys() == BY_ID.keys(), sorted(handlers.keys() ^ BY_ID.keys())
    for op in OPERATIONS:
        app.router.add_route(op.method, op.path, _guarded(handlers[op.op_id], op.action))
    return app


def _guarded(handler: Handler, action: str | None) -> Handler:
    """``handler`` behind the role check its operation declares."""
    if action is None:
        return handler

    async def guarded(request: web.Request) -> web.StreamResponse:
        require(request, action)
        return await handler(request)

    guarded.__name__ = handler.__name__
    return guarded


#: the handler of each operation in OPERATIONS, named by its op_id
HANDLERS: tuple[Handler, ...] = (
    submit_job,
    list_jobs,
    submit_batch,
    get_job,
    update_job,
    cancel_job,
    trigger_job,
    job_runs,
    explain_job,
    explain_expr,
    get_run,
    cancel_run,
    list_dlq,
    replay_dead,
    drop_dead,
    replay_dead_letters,
    drop_dead_letters,
    cluster,
    cluster_nodes,
    add_node,
    remove_node,
    join_cluster,
    scheduling_lag,
    workers,
    drain_worker,
    worker_connect,
    events,
    snapshot,
    whoami,
    create_login_code,
    login,
    openapi_json,
    metrics,
    healthz,
    readyz,
)
