"""Every operation of the HTTP surface, called with a token of each role and with none.

Made from the operations table (``schedd/api/operations.py``), so an operation is covered the
moment it is declared: a role is refused (403 ``permission_denied``) exactly when the
operation's declared action does not allow it (``schedd.auth.ACTIONS``), and never otherwise;
without a token only the public operations answer (the others 401).
"""

from __future__ import annotations

import aiohttp

from schedd.api.operations import OPERATIONS
from schedd.auth import ACTIONS, Role, Token, TokenStore
from tests.conftest import Node

SECRETS = {role: f"{role.value}-secret-0123456789abcdef" for role in Role}
PATH_VALUES = {
    "{job_id}": "01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "{run_id}": "01ZZZZZZZZZZZZZZZZZZZZZZZZ@1",
    "{worker_id}": "nobody",
    "{node}": "nobody",
}


async def call(
    http: aiohttp.ClientSession, node: Node, method: str, path: str, secret: str | None
) -> tuple[int, str | None]:
    for template, value in PATH_VALUES.items():
        path = path.replace(template, value)
    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    body = {} if method in ("POST", "PATCH") else None
    async with http.request(method, node.url + path, json=body, headers=headers) as r:
        code = None
        if r.content_type == "application/json":
            doc = await r.json()
            if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
                code = doc["error"].get("code")
        return r.status, code


async def test_every_operation_refuses_exactly_the_roles_its_action_does_not_allow(
    node: Node, http: aiohttp.ClientSession
) -> None:
    node.rt.tokens = TokenStore(
        [(Token(role.value, role), secret) for role, secret in SECRETS.items()]
    )
    wrong: list[str] = []
    for op in OPERATIONS:
        for role, secret in SECRETS.items():
            status, code = await call(http, node, op.method, op.path, secret)
            refused = status == 403 and code == "permission_denied"
            allowed = op.action is None or role in ACTIONS[op.action]
            if refused == allowed or status == 401:
                wrong.append(f"{op.op_id} as {role.value}: {status} {code}")
        status, code = await call(http, node, op.method, op.path, None)
        if (status == 401) != (op.action is not None):
            wrong.append(f"{op.op_id} without a token: {status} {code}")
    assert not wrong, "\n".join(wrong)
    assert len(OPERATIONS) >= 22  # the table is the whole surface, not a sample of it
