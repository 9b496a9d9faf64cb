"""The runs: read and cancel one, and the dead-letter queue (list, replay, drop: one run or
every run a filter selects)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from schedd.api.common import commit, next_cursor, page_of, request_id, since_param, unwrap
from schedd.api.jobs import explain_waiting
from schedd.api.ports import CONFIG, RAFT, READER, json_response, read_json
from schedd.api.views import DlqBulkView, RunListView, run_view
from schedd.core import commands
from schedd.core.model import RunState
from schedd.core.validate import parse_dlq_bulk, parse_ident, parse_text
from schedd.errors import InvalidArgument, NotFound
from schedd.logs import log_event
from schedd.storage.schema import FIRST

log = logging.getLogger(__name__)


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
    return json_response(run_view(run, await app[READER].job(run.job_id)))


async def cancel_run(request: web.Request) -> web.Response:
    return await _run_command(request, commands.CancelRun, "run.cancelled")


async def replay_dead(request: web.Request) -> web.Response:
    return await _run_command(request, commands.Replay, "dlq.replayed")


async def drop_dead(request: web.Request) -> web.Response:
    return await _run_command(request, commands.DropDead, "dlq.dropped", reply=False)


async def get_run(request: web.Request) -> web.Response:
    app = request.app
    run_id = request.match_info["run_id"]
    run = await app[READER].run(run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id}", field="run_id")
    job = await app[READER].job(run.job_id)
    view = run_view(run, job)
    if job is not None:
        await explain_waiting(request, [view], job.spec)
    return json_response(view)


async def list_dlq(request: web.Request) -> web.Response:
    app = request.app
    limit, before = page_of(request, FIRST)
    q = request.query
    filters: dict[str, str | int] = {k: q[k] for k in ("namespace", "queue", "task") if k in q}
    for key in ("namespace", "queue"):
        if key in filters:
            parse_ident(q[key], key)
    if (since := since_param(request)) is not None:
        filters["since"] = since
    if "error" in q:
        filters["error"] = parse_text(q["error"], "error")
    places: list[int] = []
    runs, after = await app[READER].dead_letters_page(before, limit, filters, places)
    kept = [(r, place) for r, place in zip(runs, places, strict=True) if r.state is RunState.FAILED]
    jobs = await app[READER].jobs_by_id(list(dict.fromkeys(r.job_id for r, _ in kept)))
    body: RunListView = {
        "runs": [run_view(r, jobs.get(r.job_id)) for r, _ in kept],
        "next_cursor": next_cursor(after),
    }
    if "places" in q:  # a node's front door merges the pages of its shards
        body["places"] = [str(place) for _, place in kept]
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
