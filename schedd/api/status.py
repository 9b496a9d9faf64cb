"""The cluster as this node sees it: the nodes, the connected workers (and draining one),
the scheduling lag, the metrics, and the health and readiness probes."""

from __future__ import annotations

import logging
import time
from urllib.parse import quote

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

import schedd
from schedd import clock
from schedd.api.cluster import cluster_view
from schedd.api.common import int_param
from schedd.api.operations import MINUTES
from schedd.api.ports import (
    CONFIG,
    LEADER_WORKERS,
    METRICS,
    NODE,
    PREFIX,
    PROXY,
    RAFT,
    READER,
    TOKEN,
    json_response,
)
from schedd.api.views import (
    HealthView,
    ReadyView,
    SchedulingLagView,
    WorkersView,
    WorkerView,
    lag_view,
    worker_view,
)
from schedd.core.state import Counted, counts_of
from schedd.errors import InvalidArgument, NotFound, Unavailable
from schedd.logs import log_event

log = logging.getLogger(__name__)


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
    minutes = int_param(request, MINUTES)
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
