"""``GET /api/v1/whoami``: the caller's token, its role, and what that role may do, from the
same table the role checks use."""

from __future__ import annotations

import aiohttp

from schedd.api.operations import OPERATIONS
from schedd.auth import Role, Token, TokenStore
from tests.conftest import Node

API = "/api/v1"
SECRETS = {role: f"{role.value}-secret-0123456789abcdef" for role in Role}


async def whoami(http: aiohttp.ClientSession, node: Node, secret: str | None) -> tuple[int, dict]:
    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    async with http.get(node.url + API + "/whoami", headers=headers) as r:
        return r.status, await r.json()


async def test_each_role_is_told_its_name_role_actions_and_operations(
    node: Node, http: aiohttp.ClientSession
) -> None:
    node.rt.tokens = TokenStore(
        [(Token(f"{role.value}-bot", role), secret) for role, secret in SECRETS.items()]
    )
    answers = {role: await whoami(http, node, secret) for role, secret in SECRETS.items()}
    assert {role: status for role, (status, _) in answers.items()} == dict.fromkeys(Role, 200)
    views = {role: body for role, (_, body) in answers.items()}
    assert views[Role.READ] == {
        "name": "read-bot",
        "role": "read",
        "actions": ["read"],
        "operations": sorted(op.op_id for op in OPERATIONS if op.action in (None, "read")),
    }
    assert views[Role.ADMIN]["actions"] == ["admin", "read", "submit", "worker"]
    assert views[Role.ADMIN]["operations"] == sorted(op.op_id for op in OPERATIONS)
    assert views[Role.SUBMIT]["actions"] == ["read", "submit"]
    assert "submit_job" in views[Role.SUBMIT]["operations"]
    assert "submit_job" not in views[Role.READ]["operations"]
    assert views[Role.WORKER]["actions"] == ["read", "worker"]
    assert "worker_connect" in views[Role.WORKER]["operations"]
    assert "worker_connect" not in views[Role.SUBMIT]["operations"]


async def test_without_a_token_it_is_a_401(node: Node, http: aiohttp.ClientSession) -> None:
    status, body = await whoami(http, node, None)
    assert status == 401 and body["error"]["code"] == "unauthenticated"
