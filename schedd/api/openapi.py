"""The OpenAPI 3.1 description of the HTTP API, served at ``GET /api/v1/openapi.json``.

:func:`spec` builds the document; enums, field lists and limits come from the code that
enforces them (``schedd.core.model``, ``schedd.core.validate``, ``schedd.errors``), so the
document and the server cannot drift apart silently.  Limits that depend on the config
(``scheduler.max_payload``, ``http.max_body``, ``limits.max_batch``) are named in descriptions
with their defaults rather than fixed in the schemas.
"""

from __future__ import annotations

import copy
import functools
from importlib import metadata
from typing import Any, Final

import orjson
from aiohttp import web

from schedd.api.operations import BY_ID, OPERATIONS
from schedd.api.ports import PREFIX
from schedd.api.schema import Components
from schedd.api.views import RESPONSES
from schedd.core.model import (
    DstGap,
    DstRepeat,
    JobStatus,
    Misfire,
    Overlap,
    Priority,
)
from schedd.core.validate import (
    IDENT_PATTERN,
    JOB_FIELDS,
    MAX_ATTEMPTS,
    MAX_DEPENDS_ON,
    MAX_TEXT,
    PATCH_FIELDS,
    SCHEDULE_FIELDS,
    TASK_PATTERN,
    ZONE_PATTERN,
)
from schedd.errors import HTTP_STATUS

__all__ = ["openapi_json", "spec"]

Schema = dict[str, Any]

_KINDS: Final = ("at", "in", "every", "cron")
_MAX_SECONDS: Final = 100 * 365 * 86_400  # the longest duration the server accepts
_CURSOR_MAX: Final = 1 << 62


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    """``schema`` or ``null``; for a request field, ``null`` means "the default"."""
    return {"anyOf": [schema, {"type": "null"}]}


def _enum(values: Any, description: str | None = None) -> Schema:
    out: Schema = {"type": "string", "enum": [v.value for v in values]}
    if description:
        out["description"] = description
    return out


def _text(description: str, max_len: int = MAX_TEXT) -> Schema:
    return {"type": "string", "minLength": 1, "maxLength": max_len, "description": description}


_TIME: Final[Schema] = {"type": "string", "format": "date-time"}
_SECONDS: Final[Schema] = {
    "type": "number",
    "minimum": 0,
    "description": "a duration in seconds (an integer when whole)",
}
# What parse_duration takes as text: "90s", "5m", "1h30m", "250ms", "2d" (spaces are ignored),
# or a plain decimal number of seconds.
_DURATION_PATTERN: Final = (
    r"^\s*(?:(?:[0-9]+(?:\.[0-9]+)? *(?:ms|s|m|h|d) *)+|[0-9]+(?:\.[0-9]+)?)\s*$"
)


def _duration(minimum_s: float, description: str) -> Schema:
    """A duration: a number of seconds or a string like ``"90s"``, ``"5m"``, ``"1h30m"``."""
    return {
        "description": description,
        "oneOf": [
            {"type": "number", "minimum": minimum_s, "maximum": _MAX_SECONDS},
            {"type": "string", "maxLength": 64, "pattern": _DURATION_PATTERN},
        ],
    }


# -- request bodies -----------------------------------------------------------------------------


def _recurring_fields() -> dict[str, Schema]:
    return {
        "timezone": _nullable(
            {
                "type": "string",
                "maxLength": 64,
                "pattern": f"^{ZONE_PATTERN}$",
                "description": 'an IANA time zone like "Europe/Berlin"; default "UTC"',
            }
        ),
        "jitter": _nullable(
            _ref("DurationOrZero")
            | {
                "description": "a random delay added to each fire time, shorter "
                "than an every interval; default 0"
            }
        ),
        "misfire": _nullable(
            _enum(
                Misfire,
                "fire times missed while no leader was scheduling; "
                "run_all is bounded by catchup_window; default "
                f"{Misfire.RUN_ONCE.value}",
            )
        ),
        "catchup_window": _nullable(_ref("Duration")),
        "overlap": _nullable(
            _enum(
                Overlap,
                "a fire time that comes while the previous run is "
                f"still going; default {Overlap.SKIP.value}",
            )
        ),
        "dst": _nullable(_ref("Dst")),
        "start_at": _nullable(_TIME),
        "end_at": _nullable(_TIME | {"description": "after start_at"}),
    }


def _schedule_variant(kind: str) -> Schema:
    """One kind of schedule: exactly one of at/in/every/cron is set (the others absent or
    null); the recurring options only go with every and cron."""
    kinds: dict[str, Schema] = {
        "at": _TIME | {"description": "run once at this time (RFC 3339)"},
        "in": _ref("DurationOrZero") | {"description": "run once after this delay"},
        "every": _duration(
            1, "run every interval (at least 1s), counted from the submission (or start_at)"
        ),
        "cron": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_TEXT,
            "pattern": r"^\s*(?:@[A-Za-z]+|\S+(?:\s+\S+){4,5})\s*$",
            "description": 'a cron expression of 5 fields ("0 2 * * *"), 6 with seconds '
            "as the last field, or @yearly, @annually, @monthly, @weekly, "
            "@daily, @midnight, @hourly; no random (R) or hashed (H) "
            "fields",
        },
    }
    recurring = kind in ("every", "cron")
    props: dict[str, Schema] = {k: kinds[k] if k == kind else {"type": "null"} for k in _KINDS}
    for name, schema in _recurring_fields().items():
        props[name] = schema if recurring else {"type": "null"}
    return {
        "type": "object",
        "title": f"Schedule{kind.capitalize()}",
        "required": [kind],
        "properties": props,
        "additionalProperties": False,
    }


def _job_body_properties() -> dict[str, Schema]:
    return {
        "task": {
            "type": "string",
            "pattern": f"^{TASK_PATTERN}$",
            "description": 'the task name workers register, like "reports.generate"',
        },
        "name": _nullable(_text("a name for people")),
        "namespace": _nullable(_ref("Ident") | {"description": 'the tenant; default "default"'}),
        "queue": _nullable(_ref("Ident") | {"description": 'the worker lane; default "default"'}),
        "payload": {
            "description": "any JSON value, handed to the task; at most "
            "scheduler.max_payload bytes encoded (default 65536, else "
            "413)"
        },
        "schedule": _nullable(_ref("Schedule") | {"description": "absent or null: run now"}),
        "priority": _nullable(_enum(Priority, f"default {Priority.NORMAL.value}")),
        "retry": _nullable(_ref("Retry")),
        "timeout": _nullable(
            _ref("Duration")
            | {"description": "an attempt running longer is cancelled and retried; default none"}
        ),
        "heartbeat_timeout": _nullable(
            _duration(
                1,
                "a lease whose heartbeats stop this long is "
                "lost; at least 1s; default "
                "scheduler.heartbeat_timeout",
            )
        ),
        "depends_on": _nullable(
            {
                "type": "array",
                "maxItems": MAX_DEPENDS_ON,
                "uniqueItems": True,
                "items": _text("a job id of the same namespace"),
                "description": "jobs that must succeed first",
            }
        ),
        "idempotency_key": _nullable(
            _text(
                "a repeated key (per namespace) returns the existing "
                "job with 200 instead of creating another"
            )
        ),
    }


def _job_body() -> Schema:
    props = _job_body_properties()
    assert tuple(props) == JOB_FIELDS
    return {
        "type": "object",
        "description": "A job submission; only task is required, null means the default.",
        "required": ["task"],
        "properties": props,
        "additionalProperties": False,
    }


def _batch_job() -> Schema:
    props = _job_body_properties()
    props["ref"] = _nullable(
        _text(
            "a name for this job that other jobs of the same batch can use in depends_on (the "
            "server assigns the ids)"
        )
    )
    return {
        "type": "object",
        "description": "A job of a batch: a JobBody plus an optional ref.",
        "required": ["task"],
        "properties": props,
        "additionalProperties": False,
    }


def _job_patch() -> Schema:
    props: dict[str, Schema] = {
        "paused": _nullable({"type": "boolean", "description": "pause or resume"}),
        "schedule": _nullable(
            _ref("Schedule") | {"description": "replaces the pending occurrence; null: run now"}
        ),
        "payload": {"description": "any JSON value; replaces the payload"},
        "priority": _nullable(_enum(Priority)),
        "retry": _nullable(
            _ref("Retry")
            | {
                "description": "replaces the whole policy (unset "
                "keys take their defaults); null: "
                "no change"
            }
        ),
        "timeout": _nullable(_ref("Duration") | {"description": "null removes the timeout"}),
    }
    assert tuple(props) == PATCH_FIELDS
    return {
        "type": "object",
        "description": "Changes that apply to runs not yet started; at least one field. A "
        "one-off job whose run already started cannot change (409).",
        "minProperties": 1,
        "properties": props,
        "additionalProperties": False,
    }


def _request_schemas() -> dict[str, Schema]:
    variants = [_schedule_variant(k) for k in _KINDS]
    names = {name for v in variants for name in v["properties"]}
    assert names == set(SCHEDULE_FIELDS)
    return {
        "Duration": _duration(
            0.001,
            'a duration: a number of seconds or a string like "90s", '
            '"5m", "1h30m"; more than zero, at most 100 years',
        ),
        "DurationOrZero": _duration(
            0,
            'a duration: a number of seconds or a string like "90s", '
            '"5m", "1h30m"; zero allowed, at most 100 years',
        ),
        "Ident": {
            "type": "string",
            "pattern": f"^{IDENT_PATTERN}$",
            "description": "1 to 64 lowercase letters, digits, - and _",
        },
        "Dst": {
            "type": "object",
            "description": "what to do with local times that do not exist (gap) or happen "
            "twice (repeat) around daylight-saving changes",
            "properties": {
                "gap": _nullable(_enum(DstGap, f"default {DstGap.SHIFT.value}")),
                "repeat": _nullable(_enum(DstRepeat, f"default {DstRepeat.FIRST.value}")),
            },
            "additionalProperties": False,
        },
        "Retry": {
            "type": "object",
            "description": "exponential backoff between attempts; initial <= max",
            "properties": {
                "max_attempts": _nullable(
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_ATTEMPTS,
                        "description": "default scheduler.default_max_attempts",
                    }
                ),
                "initial": _nullable(_ref("Duration") | {"description": "default 1s"}),
                "max": _nullable(_ref("Duration") | {"description": "default 10m"}),
                "multiplier": _nullable(
                    {"type": "number", "minimum": 1, "maximum": 10, "description": "default 2"}
                ),
                "jitter": _nullable({"type": "boolean", "description": "default true"}),
            },
            "additionalProperties": False,
        },
        "Schedule": {
            "description": 'when to run: {"at": TIME}, {"in": DURATION}, {"every": DURATION, '
            '...} or {"cron": EXPR, ...}',
            "oneOf": variants,
        },
        "JobBody": _job_body(),
        "BatchJob": _batch_job(),
        "Batch": {
            "type": "object",
            "description": "All or nothing, committed as one Raft entry; at most "
            "limits.max_batch jobs (default 10000).",
            "required": ["jobs"],
            "properties": {"jobs": {"type": "array", "minItems": 1, "items": _ref("BatchJob")}},
            "additionalProperties": False,
        },
        "JobPatch": _job_patch(),
        "Trigger": {
            "type": "object",
            "description": "respect (the default) applies the job's overlap policy; override "
            "runs now regardless",
            "properties": {"overlap": {"type": "string", "enum": ["respect", "override"]}},
            "additionalProperties": False,
        },
    }


# -- response bodies: declared by the views (schedd.api.views), derived here -----------------------


def _response_schemas() -> dict[str, Schema]:
    return Components(RESPONSES).schemas()


# -- responses ----------------------------------------------------------------------------------

_ERRORS: Final = {
    400: ("BadRequest", "bad input: the message says what was expected, field names it"),
    401: ("Unauthenticated", "no or an unknown bearer token"),
    403: ("PermissionDenied", "the token's role may not do this"),
    404: ("NotFound", "no such object"),
    409: (
        "Conflict",
        "conflicts with the current state (a dependency cycle, a change to a run "
        "that already started, a cancelled job)",
    ),
    413: (
        "PayloadTooLarge",
        "the body is over http.max_body (default 1 MiB) or the payload is "
        "over scheduler.max_payload (default 64 KiB)",
    ),
    429: (
        "TooManyRequests",
        "over the namespace's submission rate, or the node is overloaded; "
        "retry after Retry-After seconds when given",
    ),
    503: ("Unavailable", "no quorum or no known leader yet; retry after Retry-After seconds"),
}

_RETRY_AFTER: Final[Schema] = {
    "description": "seconds to wait before retrying",
    "schema": {"type": "integer", "minimum": 1},
}


def _error_response(status: int, description: str) -> Schema:
    codes = sorted(c.value for c, s in HTTP_STATUS.items() if s == status)
    schema: Schema = {
        "allOf": [
            _ref("Error"),
            {"properties": {"error": {"properties": {"code": {"enum": codes}}}}},
        ],
    }
    out: Schema = {"description": description, "content": {"application/json": {"schema": schema}}}
    if status in (429, 503):
        out["headers"] = {"Retry-After": _RETRY_AFTER}
    return out


def _json(description: str, schema: Schema) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# -- paths --------------------------------------------------------------------------------------

_WRITE_ERRORS: Final = (400, 429, 503)  # X-Request-Id, Raft queue full, no leader


def _op(
    op_id: str,
    ok: dict[int, Schema],
    errors: tuple[int, ...] = (),
    *,
    params: tuple[Schema, ...] = (),
    body: Schema | None = None,
    description: str | None = None,
) -> Schema:
    declared = BY_ID[op_id]
    role, summary = declared.action, declared.summary
    codes = set(errors)
    if role is not None:
        codes.add(401)
    if role in ("submit", "worker", "admin"):
        codes.add(403)  # every role may read
    responses: dict[str, Schema] = {str(s): r for s, r in sorted(ok.items())}
    for status in sorted(codes):
        responses[str(status)] = {"$ref": f"#/components/responses/{_ERRORS[status][0]}"}
    op: Schema = {"operationId": op_id, "summary": summary}
    if description:
        op["description"] = description
    if role is None:
        op["security"] = []
    else:
        op["x-required-role"] = role
    if params:
        op["parameters"] = list(params)
    if body is not None:
        op["requestBody"] = body
    op["responses"] = responses
    return op


def _param(name: str) -> Schema:
    return {"$ref": f"#/components/parameters/{name}"}


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _body(schema: str, required: bool = True) -> Schema:
    return {"required": required, "content": {"application/json": {"schema": _ref(schema)}}}


def _paths() -> dict[str, Schema]:
    job_id, run_id, rid = _param("JobId"), _param("RunId"), _param("RequestId")
    page = (
        _query(
            "limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}, "page size"
        ),
        _query(
            "cursor",
            {"type": "integer", "minimum": 0, "maximum": _CURSOR_MAX},
            "next_cursor of the previous page",
        ),
    )
    count = _query(
        "count",
        {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
        "how many fire times",
    )
    job = _json("the job", _ref("Job"))
    run = _json("the run", _ref("Run"))
    no_content = {"description": "done; no body"}
    details: dict[str, Schema] = {
        "submit_job": _op(
            "submit_job",
            {
                201: _json("created", _ref("Job")),
                200: _json(
                    "the existing job: its idempotency_key was seen before (or "
                    "the X-Request-Id repeated)",
                    _ref("Job"),
                ),
            },
            (*_WRITE_ERRORS, 404, 409, 413),
            params=(rid,),
            body=_body("JobBody"),
            description="404 when depends_on names an unknown job.",
        ),
        "list_jobs": _op(
            "list_jobs",
            {200: _json("a page", _ref("JobList"))},
            (400,),
            params=(
                _query("namespace", _ref("Ident"), "only this namespace"),
                _query("queue", _ref("Ident"), "only this queue"),
                _query("status", _enum(JobStatus), "only jobs in this status"),
                _query("task", {"type": "string"}, "only this task"),
                *page,
            ),
        ),
        "submit_batch": _op(
            "submit_batch",
            {
                201: _json(
                    "created (jobs whose idempotency_key repeats are the existing ones)",
                    _ref("BatchResult"),
                )
            },
            (*_WRITE_ERRORS, 404, 409, 413),
            params=(rid,),
            body=_body("Batch"),
            description="Items may name each other by ref in depends_on; a cycle "
            "is a 409. A batch larger than the namespace's burst is a "
            "429 without Retry-After: split it.",
        ),
        "get_job": _op(
            "get_job",
            {200: job},
            (404,),
            params=(job_id,),
        ),
        "update_job": _op(
            "update_job",
            {200: job},
            (*_WRITE_ERRORS, 404, 409, 413),
            params=(job_id, rid),
            body=_body("JobPatch"),
        ),
        "cancel_job": _op(
            "cancel_job",
            {204: no_content},
            (*_WRITE_ERRORS, 404),
            params=(job_id, rid),
            description="Running runs are told to stop. Cancelling a cancelled "
            "or finished job is a no-op (204).",
        ),
        "trigger_job": _op(
            "trigger_job",
            {201: _json("the new run (skipped when the overlap policy says so)", _ref("Run"))},
            (*_WRITE_ERRORS, 404, 409, 413),
            params=(job_id, rid),
            body=_body("Trigger", required=False),
            description="409 when the job is cancelled.",
        ),
        "job_runs": _op(
            "job_runs",
            {200: _json("a page of runs", _ref("RunList"))},
            (400, 404),
            params=(job_id, *page),
        ),
        "explain_job": _op(
            "explain_job",
            {200: _json("the next fire times (one or none for a one-off job)", _ref("Explain"))},
            (400, 404),
            params=(job_id, count),
        ),
        "explain_expr": _op(
            "explain_expr",
            {200: _json("the next fire times", _ref("Explain"))},
            (400,),
            params=(
                _query("cron", {"type": "string"}, "a cron expression (this or every is required)"),
                _query(
                    "every",
                    {"type": "string", "pattern": _DURATION_PATTERN},
                    "an interval (this or cron is required)",
                ),
                _query("timezone", {"type": "string"}, "an IANA zone; default UTC"),
                _query(
                    "jitter",
                    {"type": "string", "pattern": _DURATION_PATTERN},
                    "a jitter duration",
                ),
                _query("dst_gap", _enum(DstGap), "what to do in a DST gap"),
                _query("dst_repeat", _enum(DstRepeat), "what to do in a DST repeat"),
                count,
            ),
        ),
        "get_run": _op(
            "get_run",
            {200: run},
            (404,),
            params=(run_id,),
        ),
        "cancel_run": _op(
            "cancel_run",
            {200: run},
            (*_WRITE_ERRORS, 404, 409),
            params=(run_id, rid),
            description="A running run is told to stop; cancelling a finished run "
            "is a no-op (200).",
        ),
        "list_dlq": _op(
            "list_dlq",
            {200: _json("a page of failed runs", _ref("RunList"))},
            (400,),
            params=page,
        ),
        "replay_dead": _op(
            "replay_dead",
            {200: run},
            (*_WRITE_ERRORS, 404, 409),
            params=(run_id, rid),
        ),
        "drop_dead": _op(
            "drop_dead",
            {204: no_content},
            (*_WRITE_ERRORS, 404),
            params=(run_id, rid),
        ),
        "cluster": _op(
            "cluster",
            {200: _json("this node's view", _ref("Cluster"))},
        ),
        "workers": _op(
            "workers",
            {200: _json("the leader's workers", _ref("Workers"))},
            (503,),
            description="Answered by the leader (a follower asks it); 503 when "
            "no leader is known or reachable.",
        ),
        "worker_connect": _op(
            "worker_connect",
            {
                101: {
                    "description": "switching to the websocket protocol: text "
                    "frames, one JSON object each, with a type "
                    "(hello, welcome, lease, heartbeat, complete, "
                    "fail, ack, cancel, drain, redirect, error)"
                }
            },
            (400,),
            description="400 for a request that is not a websocket upgrade.",
        ),
        "openapi_json": _op(
            "openapi_json",
            {200: _json("the OpenAPI 3.1 description of the API", {"type": "object"})},
        ),
        "metrics": _op(
            "metrics",
            {
                200: {
                    "description": "the Prometheus text exposition format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        ),
        "healthz": _op(
            "healthz",
            {200: _json("the process is up", _ref("Health"))},
        ),
        "readyz": _op(
            "readyz",
            {200: _json("ready", _ref("Ready"))},
            (503,),
        ),
    }
    missing = sorted(op.op_id for op in OPERATIONS if op.op_id not in details)
    extra = sorted(set(details) - set(BY_ID))
    if missing or extra:
        raise AssertionError(
            f"operations without a document: {missing}; documents of no operation: {extra}"
        )
    paths: dict[str, Schema] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = details[op.op_id]
    for path, ops in paths.items():  # tag by the first segment: jobs, runs, dlq, cluster, ...
        tag = path.removeprefix(PREFIX).strip("/").split("/")[0].removesuffix(".json")
        for op in ops.values():
            op["tags"] = [tag if path.startswith(PREFIX) else "operations"]
    return paths


def _version() -> str:
    try:
        return metadata.version("schedd")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"


@functools.cache
def _spec() -> Schema:
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {
            "title": "schedd",
            "version": _version(),
            "description": "The schedd HTTP JSON API. Durations are a number of seconds or a "
            'string like "90s", "5m", "1h30m"; times are RFC 3339, returned in '
            "UTC. Every write is committed through Raft before the reply; "
            "repeat a write with the same X-Request-Id to get its first result.",
        },
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a token from the tokens file; roles admin, "
                    "submit, read, worker",
                },
            },
            "parameters": {
                "JobId": {
                    "name": "job_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "a job id (opaque)",
                },
                "RunId": {
                    "name": "run_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "a run id (opaque)",
                },
                "RequestId": {
                    "name": "X-Request-Id",
                    "in": "header",
                    "required": False,
                    "schema": {
                        "type": "string",
                        "minLength": 8,
                        "maxLength": 128,
                        "pattern": r"^[\x20-\x7e]+$",
                    },
                    "description": "makes a write idempotent: a repeat (with the "
                    "same token) gets the first result",
                },
            },
            "responses": {
                name: _error_response(status, text) for status, (name, text) in _ERRORS.items()
            },
            "schemas": _request_schemas() | _response_schemas(),
        },
    }


def spec() -> Schema:
    """The OpenAPI 3.1 document (a fresh copy: callers may change it)."""
    return copy.deepcopy(_spec())


@functools.cache
def _spec_bytes() -> bytes:
    return orjson.dumps(_spec())


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /api/v1/openapi.json``: the document, for any role."""
    return web.Response(body=_spec_bytes(), content_type="application/json")
