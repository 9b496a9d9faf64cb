"""The OpenAPI 3.1 description of the HTTP API, served at ``GET /api/v1/openapi.json``.

Nothing in it is written here: :func:`spec` renders the operation table
(``schedd.api.operations``: paths, roles, parameters and their limits, replies, errors) with the
schemas derived from the request bodies (``schedd.api.bodies``) and the response bodies
(``schedd.api.views``) as the code declares them, and the error codes of ``schedd.errors``.
"""

from __future__ import annotations

import copy
import functools
import re
from importlib import metadata
from typing import Any, Final

import orjson
from aiohttp import web

from schedd.api.bodies import REQUESTS, SCALARS
from schedd.api.consistency import MODES, READ_WAIT_S
from schedd.api.operations import OPERATIONS, WRITE_ERRORS, Operation
from schedd.api.ports import PREFIX
from schedd.api.schema import Components
from schedd.api.views import RESPONSES
from schedd.core.events import KINDS, MAX_INDEX
from schedd.errors import HTTP_STATUS
from schedd.protocol.headers import CONSISTENCY_HEADER, INDEX_HEADER, MIN_INDEX_HEADER

_MIN_INDEX = (
    "answer once this node's reads see at least this Raft index (the highest X-Schedd-Index "
    f"the client was given), waiting at most {READ_WAIT_S:g} s, else 503 with Retry-After"
)
_CONSISTENCY = (
    "default: this node's state (as fresh as min_index asks); consistent: the latest state "
    "of the cluster, after a round trip through the leader (costs a write)"
)

__all__ = ["openapi_json", "spec"]

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


_OTHER: Final[dict[str, Schema]] = {
    "OpenApi": {"type": "object", "description": "an OpenAPI 3.1 document"},
    "Text": {"type": "string"},
    "Snapshot": {
        "type": "string",
        "contentMediaType": "application/octet-stream",
        "description": "a schedd image (schedctl snapshot save writes it to a file, schedctl "
        "snapshot inspect checks one, schedd restore seeds a new cluster from one)",
    },
    "EventStream": {
        "description": "one event of the text/event-stream (lines 'id: N', 'event: KIND', "
        "'data: JSON' and a blank line; a line starting with ':' is a comment). id: the Raft "
        "index the event covers up to (with several shards, a stamp that compares across "
        "them), on the last event of each write only",
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"enum": ["hello", "reset", *KINDS]},
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "retry": {"type": "integer", "minimum": 0},
            "data": {"type": "string", "contentMediaType": "application/json"},
        },
        "oneOf": [
            {
                "properties": {
                    "event": {"enum": ["hello", "reset"]},
                    "data": {"contentSchema": _ref("StreamStart")},
                }
            },
            *(
                {
                    "properties": {
                        "event": {"const": kind},
                        "data": {
                            "contentSchema": {
                                "type": "array",
                                "items": _ref(f"{kind.capitalize()}Change"),
                            }
                        },
                    }
                }
                for kind in KINDS
            ),
        ],
    },
}
COMPONENTS: Final = Components({**SCALARS, **REQUESTS, **RESPONSES, **_OTHER})
_PATH_PARAMS: Final = {
    "job_id": "JobId",
    "run_id": "RunId",
    "worker_id": "WorkerId",
    "node": "NodeRef",
}


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


# -- paths --------------------------------------------------------------------------------------


def _responses(op: Operation) -> dict[str, Schema]:
    codes = set(op.errors)
    if op.write:
        codes.update(WRITE_ERRORS)
    if op.fresh:
        codes.update((400, 503))  # a bad min_index or consistency; min_index not reached
    if op.action is not None:
        codes.add(401)
    if op.action in ("submit", "worker", "admin"):
        codes.add(403)  # every role may read
    responses: dict[str, Schema] = {}
    for reply in sorted(op.replies, key=lambda r: r.status):
        answer: Schema = {"description": reply.description}
        headers = {
            h.name: {
                "description": h.description,
                "required": True,
                "schema": COMPONENTS.schema_of(h.type),
            }
            for h in reply.headers
        }
        if op.fresh or op.write:
            headers[INDEX_HEADER] = {"$ref": "#/components/headers/Index"}
        if headers:
            answer["headers"] = headers
        if reply.body is not None:
            answer["content"] = {reply.media: {"schema": _ref(reply.body)}}
        responses[str(reply.status)] = answer
    for status in sorted(codes):
        responses[str(status)] = {"$ref": f"#/components/responses/{_ERRORS[status][0]}"}
    return responses


def _parameters(op: Operation) -> list[Schema]:
    params: list[Schema] = [
        {"$ref": f"#/components/parameters/{_PATH_PARAMS[name]}"}
        for name in re.findall(r"{(\w+)}", op.path)
    ]
    if op.write:
        params.append({"$ref": "#/components/parameters/RequestId"})
    if op.fresh:
        params += [
            {"$ref": f"#/components/parameters/{name}"}
            for name in ("MinIndex", "MinIndexHeader", "Consistency", "ConsistencyHeader")
        ]
    params += [
        {
            "name": q.name,
            "in": "query",
            "required": False,
            "schema": COMPONENTS.schema_of(q.type),
            "description": q.description,
        }
        for q in op.query
    ]
    params += [
        {
            "name": h.name,
            "in": "header",
            "required": False,
            "schema": COMPONENTS.schema_of(h.type),
            "description": h.description,
        }
        for h in op.headers
    ]
    return params


def _operation(op: Operation) -> Schema:
    out: Schema = {"operationId": op.op_id, "summary": op.summary}
    if op.description:
        out["description"] = op.description
    if op.action is None:
        out["security"] = []
    else:
        out["x-required-role"] = op.action
    params = _parameters(op)
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    out["responses"] = _responses(op)
    return out


def _paths() -> dict[str, Schema]:
    paths: dict[str, Schema] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
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
                "WorkerId": {
                    "name": "worker_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "a connected worker's id (GET /workers)",
                },
                "NodeRef": {
                    "name": "node",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string"},
                    "description": "a member's node id or Raft address (GET /cluster/nodes)",
                },
                "MinIndex": {
                    "name": "min_index",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_INDEX},
                    "description": _MIN_INDEX,
                },
                "MinIndexHeader": {
                    "name": MIN_INDEX_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_INDEX},
                    "description": f"as the query parameter min_index. {_MIN_INDEX}",
                },
                "Consistency": {
                    "name": "consistency",
                    "in": "query",
                    "required": False,
                    "schema": {"enum": list(MODES), "default": "default"},
                    "description": _CONSISTENCY,
                },
                "ConsistencyHeader": {
                    "name": CONSISTENCY_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"enum": list(MODES)},
                    "description": f"as the query parameter consistency. {_CONSISTENCY}",
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
            "headers": {
                "Index": {
                    "description": "the Raft index of the entry a write was applied in, or "
                    "the one a read's node had reached: pass the highest seen as min_index",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                },
            },
            "responses": {
                name: _error_response(status, text) for status, (name, text) in _ERRORS.items()
            },
            "schemas": COMPONENTS.schemas(),
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
