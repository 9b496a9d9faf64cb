"""The jobs: submit (one or a batch), list, read, update, cancel, trigger, explain, and a
job's runs."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from aiohttp import web

from schedd import clock
from schedd.api.common import (
    choice,
    commit,
    defaults,
    from_param,
    int_param,
    next_cursor,
    page_of,
    request_id,
    since_param,
    unwrap,
)
from schedd.api.operations import COUNT, LIMIT
from schedd.api.ports import CONFIG, RAFT, RATE_LIMITS, READER, SHARD, json_response, read_json
from schedd.api.status import _connected_workers
from schedd.api.views import (
    BatchResultView,
    ExplainView,
    JobListView,
    JobView,
    RunListView,
    RunView,
    UpstreamView,
    job_view,
    run_view,
    waiting_reason,
)
from schedd.core import commands
from schedd.core.durations import format_time
from schedd.core.fairness import take_submits
from schedd.core.model import Direction, Job, JobSort, JobSpec, JobStatus, RunState, ScheduleKind
from schedd.core.recurrence import explain, recurrence_from
from schedd.core.runs import MISFIRE_GRACE_MS, is_recurring, recurrence
from schedd.core.state import Rejected
from schedd.core.validate import parse_batch, parse_ident, parse_job, parse_patch, parse_schedule
from schedd.errors import Conflict, InvalidArgument, NotFound, SchedError
from schedd.ids import could_be_job_id_prefix, is_job_id, new_job_id
from schedd.logs import log_event
from schedd.storage.reader import MAX_IDS, JobKey, JobOrder
from schedd.storage.schema import FIRST

log = logging.getLogger(__name__)


def check_rate(app: web.Application, specs: list[Any], now: int) -> None:
    """Per-namespace submission rate limits: 429 with Retry-After when over."""
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.namespace] = counts.get(spec.namespace, 0) + 1
    refused = take_submits(app[RATE_LIMITS], counts, now, app[CONFIG].limits.submit_burst)
    if refused is not None:
        raise refused


def _id_shard(app: web.Application) -> int | None:
    """The shard new job ids are made in (None: a cluster of one shard, ids as ever)."""
    return app[SHARD] if app[CONFIG].cluster.shards > 1 else None


async def submit_job(request: web.Request) -> web.Response:
    app = request.app
    body = await read_json(request)
    now = clock.wall_ms()
    spec = parse_job(body, now_ms=now, defaults=defaults(app[CONFIG]))
    spec = await _upstreams_by_name(request, spec, "depends_on")
    check_rate(app, [spec], now)
    job_id = new_job_id(now, _id_shard(app))
    res = await commit(
        app[RAFT],
        lambda rid, t: commands.Submit(rid, t, ((job_id, spec),)),
        await request_id(request),
    )
    [(job, created, latest)] = unwrap(res)  # the job and its latest run, as applied
    view = job_view(job, latest)
    await _warn_unserved(request, [(spec, view)] if created else [])
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
    refs_given = {ref for ref in refs if ref is not None}
    specs = [
        await _upstreams_by_name(request, spec, f"jobs[{i}].depends_on", refs_given)
        for i, spec in enumerate(specs)
    ]
    check_rate(app, specs, now)
    ids = [new_job_id(now, _id_shard(app)) for _ in specs]
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
    made = unwrap(res)
    views = [job_view(job, latest) for job, _, latest in made]
    await _warn_unserved(
        request, [(job.spec, view) for (job, new, _), view in zip(made, views, strict=True) if new]
    )
    batch: BatchResultView = {"jobs": views}
    return json_response(batch, 201)


#: how far in the past ``schedule.at`` may be without a warning (a clock a little behind)
PAST_AT_GRACE_MS = 60_000


async def _warn_unserved(request: web.Request, created: list[tuple[JobSpec, JobView]]) -> None:
    """Add to each new job's view what a submit warns of: an ``at`` in the past (the run is
    due at once), and that no connected worker would take its runs (asked once for the whole
    batch; left unsaid when it cannot be asked)."""
    if not created:
        return
    now = clock.wall_ms()
    for spec, view in created:
        at = spec.schedule.at_ms
        if spec.schedule.kind is ScheduleKind.AT and at is not None and at < now - PAST_AT_GRACE_MS:
            view.setdefault("warnings", []).append(
                f"schedule.at {format_time(at)} is in the past: the run is due now"
            )
    try:
        workers = await _connected_workers(request, recent=True)
    except SchedError:
        return
    for spec, view in created:
        if (warning := waiting_reason(spec.task, spec.queue, workers)) is not None:
            view.setdefault("warnings", []).append(warning)


async def _upstreams_by_name(
    request: web.Request, spec: JobSpec, field: str, refs: Collection[str] = ()
) -> JobSpec:
    """``spec`` with each ``depends_on`` that is not a job id (nor a ref of its batch) taken
    as a job's name in its namespace, as ``schedctl`` names jobs: the one live (active or
    paused) job of that name, else the one job of that name; 404 for none, 409 naming them
    for several; 400 when two entries name the same job."""
    if all(is_job_id(dep) or dep in refs for dep in spec.depends_on):
        return spec
    out: list[str] = []
    for i, dep in enumerate(spec.depends_on):
        where = f"{field}[{i}]"
        job_id = dep if is_job_id(dep) or dep in refs else await _named(request, spec, dep, where)
        if job_id in out:
            raise InvalidArgument(
                f"{where}: expected each upstream once; {dep!r} is also "
                f"{field}[{out.index(job_id)}] ({job_id})",
                field=where,
            )
        out.append(job_id)
    return replace(spec, depends_on=tuple(out))


async def _named(request: web.Request, spec: JobSpec, name: str, where: str) -> str:
    """The id of the job ``name`` means in ``spec``'s namespace (see :func:`_upstreams_by_name`):
    a few of each status are read, enough to tell one from several."""
    reader = request.app[READER]
    found: list[Job] = []
    for status in (JobStatus.ACTIVE, JobStatus.PAUSED, None):
        if status is None and found:
            break  # live ones were found: the finished ones do not count
        filters = {"namespace": spec.namespace, "name": name}
        if status is not None:
            filters["status"] = status.value
        found += (await reader.jobs_page(6, filters))[0]
    if len(found) == 1:
        return found[0].id
    if not found:
        raise NotFound(
            f"{where}: no job with id or name {name!r} in namespace {spec.namespace!r}",
            field=where,
        )
    live = found[0].status in (JobStatus.ACTIVE, JobStatus.PAUSED)
    ids = ", ".join(j.id for j in found[:5])
    raise Conflict(
        f"{where}: several {'live ' if live else ''}jobs are named {name!r} in namespace "
        f"{spec.namespace!r} ({ids}{', …' if len(found) > 5 else ''}): name the upstream by "
        "its id",
        field=where,
    )


async def _upstream_views(request: web.Request, job_ids: tuple[str, ...]) -> list[UpstreamView]:
    reader = request.app[READER]
    jobs = await reader.jobs_by_id(list(job_ids))
    latest = await reader.latest_runs(list(job_ids))
    out: list[UpstreamView] = []
    for job_id in job_ids:
        job, run = jobs.get(job_id), latest.get(job_id)
        out.append(
            {
                "job_id": job_id,
                "name": None if job is None else job.spec.name,
                "status": None if job is None else job.status.value,
                "run_id": None if run is None else run.id,
                "state": None if run is None else run.state.value,
            }
        )
    return out


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


def job_order(request: web.Request) -> tuple[JobOrder, JobKey | None]:
    """A job listing's ``sort`` and ``order``, and its ``cursor`` (a previous page's
    ``next_cursor`` in that order)."""
    sort = JobSort(choice(request, "sort", JobSort) or JobSort.CREATED)
    direction = choice(request, "order", Direction)
    order = JobOrder(sort, None if direction is None else direction == Direction.DESC)
    raw = request.query.get("cursor")
    if raw is None:
        return order, None
    after = order.parse_cursor(raw)
    if after is None:
        raise InvalidArgument(
            f"cursor: expected the next_cursor of a previous page sorted by {sort.value}, "
            f"got {raw[:60]!r}",
            field="cursor",
        )
    return order, after


async def list_jobs(request: web.Request) -> web.Response:
    app = request.app
    limit = int_param(request, LIMIT)
    order, after = job_order(request)
    q = request.query
    filters = {k: q[k] for k in ("namespace", "queue", "task", "name") if k in q}
    for key in ("namespace", "queue"):
        if key in filters:
            parse_ident(filters[key], key)
    for key, enum in (("status", JobStatus), ("last_run", RunState)):
        if (value := choice(request, key, enum)) is not None:
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
    places: list[str] | None = [] if "places" in q else None
    jobs, cursor = await app[READER].jobs_page(limit, filters, order, after, places)
    latest = await app[READER].latest_runs([job.id for job in jobs])
    body: JobListView = {
        "jobs": [job_view(job, latest.get(job.id)) for job in jobs],
        "next_cursor": cursor,
    }
    if places is not None:  # a node's front door merges the pages of its shards
        body["places"] = places
    return json_response(body)


def job_id_param(request: web.Request) -> str:
    return request.match_info["job_id"]


async def get_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = job_id_param(request)
    job = await app[READER].job(job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    view = job_view(job, await app[READER].latest_run(job_id))
    if view["latest_run"] is not None:
        await explain_waiting(request, [view["latest_run"]], job.spec)
    return json_response(view)


async def cancel_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = job_id_param(request)
    unwrap(
        await commit(
            app[RAFT], lambda rid, t: commands.CancelJob(rid, t, job_id), await request_id(request)
        )
    )
    log_event(log, "job.cancelled", job_id=job_id)
    return web.Response(status=204)


async def update_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = job_id_param(request)
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
    job_id = job_id_param(request)
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
    view = run_view(await app[READER].run(run.id) or run, await app[READER].job(job_id))
    log_event(log, "job.triggered", job_id=job_id, run_id=run.id, overlap=overlap)
    return json_response(view, 201)


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
    job_id = job_id_param(request)
    count = int_param(request, COUNT)
    start = from_param(request)
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
    count = int_param(request, COUNT)
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
    start = from_param(request)
    now = clock.wall_ms() if start is None else start
    parsed, options = parse_schedule(schedule, now, "schedule")
    assert options is not None
    fires = explain(recurrence_from(parsed, options, now), now, count, "explain")
    return json_response(_fires_view(fires))


async def job_runs(request: web.Request) -> web.Response:
    app = request.app
    job_id = job_id_param(request)
    job = await app[READER].job(job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    limit, before = page_of(request, FIRST)
    state = choice(request, "state", RunState)
    runs, after = await app[READER].runs_page(
        job_id, before, limit, None if state is None else RunState(state), since_param(request)
    )
    body: RunListView = {
        "runs": [run_view(r, job) for r in runs],
        "next_cursor": next_cursor(after),
    }
    await explain_waiting(request, body["runs"], job.spec)
    return json_response(body)


#: the reasons of a run that its upstream jobs hold back or made skip
_UPSTREAM_REASONS = ("dependencies", "upstream_failed")


async def explain_waiting(request: web.Request, views: list[RunView], spec: JobSpec) -> None:
    """Say in each queued run's view why no worker takes it, from the workers connected to the
    leader (asked of it from a follower; left unsaid when it cannot be asked), and name the
    upstream jobs of a run they block or made skip, each with its latest run."""
    if spec.depends_on and any(v.get("reason") in _UPSTREAM_REASONS for v in views):
        upstream = await _upstream_views(request, spec.depends_on)
        for view in views:
            if view.get("reason") in _UPSTREAM_REASONS:
                view["upstream"] = upstream
    if not any(v["state"] == RunState.QUEUED.value for v in views):
        return
    try:
        workers = await _connected_workers(request, recent=True)
    except SchedError:
        return
    for view in views:
        if view["state"] == RunState.QUEUED.value:
            view["waiting"] = waiting_reason(spec.task, spec.queue, workers)
