"""Who the caller is, and the dashboard's sign-in (a one-time login code for a session)."""

from __future__ import annotations

import json

from aiohttp import web

from schedd import clock
from schedd.api.operations import OPERATIONS
from schedd.api.ports import CONFIG, LOGIN_CODES, TOKEN, TOKENS, json_response, read_json
from schedd.api.views import LoginCodeView, SessionView, WhoamiView
from schedd.auth import ACTIONS, SESSION_PREFIX, Role
from schedd.core.durations import format_time
from schedd.errors import InvalidArgument, PermissionDenied


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
