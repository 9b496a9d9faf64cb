"""The HTTP JSON API (aiohttp): the application, its middlewares, and the handler of each
operation of ``schedd.api.operations.OPERATIONS`` behind the role check it declares.  The
handlers are grouped by resource: ``jobs``, ``runs`` (and the dead-letter queue), ``status``
(the cluster, workers, lag, health), ``sessions``, ``members``, ``events``, ``snapshot``,
``ws`` (the workers' websocket); what they share is in ``common``."""

from __future__ import annotations

from aiohttp import web

from schedd.api.caps import shard_caps
from schedd.api.common import Handler
from schedd.api.consistency import fresh, indexed
from schedd.api.events import events
from schedd.api.jobs import (
    cancel_job,
    explain_expr,
    explain_job,
    get_job,
    job_runs,
    list_jobs,
    submit_batch,
    submit_job,
    trigger_job,
    update_job,
)
from schedd.api.links import shard_link
from schedd.api.members import add_node, cluster_nodes, join_cluster, remove_node
from schedd.api.middleware import (
    auth_middleware,
    errors_middleware,
    metrics_middleware,
    shard_middleware,
)
from schedd.api.openapi import openapi_json
from schedd.api.operations import BY_ID, OPERATIONS
from schedd.api.ports import Ports, install, require
from schedd.api.runs import (
    cancel_run,
    drop_dead,
    drop_dead_letters,
    get_run,
    list_dlq,
    replay_dead,
    replay_dead_letters,
)
from schedd.api.sessions import create_login_code, login, whoami
from schedd.api.snapshot import SAVES, Saves, snapshot
from schedd.api.status import (
    cluster,
    drain_worker,
    healthz,
    metrics,
    readyz,
    scheduling_lag,
    workers,
)
from schedd.api.ws import worker_connect
from schedd.ui import mount as mount_ui


def make_app(ports: Ports) -> web.Application:
    middlewares = [metrics_middleware, errors_middleware, auth_middleware]
    if ports.config.cluster.shards > 1:
        middlewares.insert(0, shard_middleware)
    app = web.Application(middlewares=middlewares, client_max_size=ports.config.http.max_body)
    install(app, ports)
    app[SAVES] = Saves()
    mount_ui(app, lambda: _other_nodes(ports))  # the dashboard at /ui/ (no token for its files)
    handlers = {h.__name__: h for h in HANDLERS}
    assert handlers.keys() == BY_ID.keys(), sorted(handlers.keys() ^ BY_ID.keys())
    for op in OPERATIONS:
        handler = handlers[op.op_id]
        if op.fresh:
            handler = fresh(handler)
        if op.write:
            handler = indexed(handler)
        app.router.add_route(op.method, op.path, _guarded(handler, op.action))
    return app


def _other_nodes(ports: Ports) -> list[str]:
    """The other nodes' API URLs: as configured, and as each said over Raft (a node added
    since)."""
    said = [str(h.get("http")) for h in ports.raft.peer_hellos().values() if h.get("http")]
    return [*ports.config.peer_http_urls(), *said]


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
    shard_caps,
    shard_link,
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
