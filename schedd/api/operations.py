"""Every operation of the HTTP surface, declared once: its id, method, path, the action its
caller's role must be allowed (``schedd.auth.ACTIONS``; None: no token needed) and its summary.

The routes and their role checks (``schedd/api/app.py``), the OpenAPI document
(``schedd/api/openapi.py``, which adds each operation's parameters and schemas by id) and the
test of every operation's role matrix are all made from this table.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedd.api.ports import PREFIX


@dataclass(frozen=True, slots=True)
class Operation:
    op_id: str  # also the name of its handler
    method: str
    path: str  # an aiohttp and OpenAPI path template
    action: str | None  # what the caller's role must be allowed; None: public
    summary: str


OPERATIONS: tuple[Operation, ...] = (
    Operation("submit_job", "POST", f"{PREFIX}/jobs", "submit", "Submit a job"),
    Operation("list_jobs", "GET", f"{PREFIX}/jobs", "read", "List jobs"),
    Operation(
        "submit_batch",
        "POST",
        f"{PREFIX}/jobs/batch",
        "submit",
        "Submit jobs at once, all or nothing",
    ),
    Operation("get_job", "GET", f"{PREFIX}/jobs/{{job_id}}", "read", "One job"),
    Operation("update_job", "PATCH", f"{PREFIX}/jobs/{{job_id}}", "submit", "Change a job"),
    Operation(
        "cancel_job",
        "DELETE",
        f"{PREFIX}/jobs/{{job_id}}",
        "submit",
        "Cancel a job and its unfinished runs",
    ),
    Operation(
        "trigger_job", "POST", f"{PREFIX}/jobs/{{job_id}}/trigger", "submit", "Run a job now"
    ),
    Operation(
        "job_runs",
        "GET",
        f"{PREFIX}/jobs/{{job_id}}/runs",
        "read",
        "A job's runs, newest first, with their attempts",
    ),
    Operation(
        "explain_job", "GET", f"{PREFIX}/jobs/{{job_id}}/explain", "read", "A job's next fire times"
    ),
    Operation(
        "explain_expr",
        "GET",
        f"{PREFIX}/explain",
        "read",
        "The next fire times of a schedule expression",
    ),
    Operation("get_run", "GET", f"{PREFIX}/runs/{{run_id}}", "read", "One run"),
    Operation("cancel_run", "POST", f"{PREFIX}/runs/{{run_id}}/cancel", "submit", "Cancel a run"),
    Operation("list_dlq", "GET", f"{PREFIX}/dlq", "read", "The dead-letter queue, newest first"),
    Operation(
        "replay_dead",
        "POST",
        f"{PREFIX}/dlq/{{run_id}}/replay",
        "submit",
        "Run a dead-lettered run again",
    ),
    Operation(
        "drop_dead",
        "DELETE",
        f"{PREFIX}/dlq/{{run_id}}",
        "submit",
        "Drop a run from the dead-letter queue",
    ),
    Operation(
        "cluster", "GET", f"{PREFIX}/cluster", "read", "Nodes, roles, leader, term, indexes, health"
    ),
    Operation("workers", "GET", f"{PREFIX}/workers", "read", "Connected workers"),
    Operation(
        "worker_connect",
        "GET",
        f"{PREFIX}/workers/connect",
        "worker",
        "The worker protocol (websocket)",
    ),
    Operation("openapi_json", "GET", f"{PREFIX}/openapi.json", "read", "This document"),
    Operation("metrics", "GET", "/metrics", "read", "Prometheus metrics"),
    Operation("healthz", "GET", "/healthz", None, "Liveness"),
    Operation(
        "readyz", "GET", "/readyz", None, "Readiness: a member of a cluster with a known leader"
    ),
)

BY_ID: dict[str, Operation] = {op.op_id: op for op in OPERATIONS}

#: paths anyone may call without a token
PUBLIC_PATHS: frozenset[str] = frozenset(op.path for op in OPERATIONS if op.action is None)
