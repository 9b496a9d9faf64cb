"""GET /api/v1/openapi.json: a valid OpenAPI 3.1 document that names every route, and that the
real answers of a live one-node cluster (successes and errors) match."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from schedd.api.app import make_app
from schedd.api.openapi import spec
from schedd.auth import Role, Token, TokenStore
from schedd.protocol import messages
from tests.conftest import Node, wait_for
from tests.integration.test_worker_protocol import connect

API = "/api/v1"
READ_SECRET = "viewer-secret-0123456789"
# shared/ sits beside the repository (in CI too)
CONTRACTS = (
    Path(__file__).resolve().parents[3] / "shared" / "contract.md",
    Path("/work/shared/contract.md"),
)


def _resolve(doc: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """Follow a ``$ref`` to another object of the document (responses, parameters)."""
    while "$ref" in obj:
        node: Any = doc
        for part in obj["$ref"].removeprefix("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        obj = node
    return obj


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A 2020-12 validator for ``schema``, with ``#/components/...`` refs resolving into ``doc``
    and formats (date-time) checked."""
    jsonschema = pytest.importorskip("jsonschema")
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
        "allOf": [schema],
    }
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    assert "date-time" in checker.checkers, "install rfc3339-validator to check date-times"
    return jsonschema.Draft202012Validator(root, format_checker=checker)


def _component(doc: dict[str, Any], name: str) -> Any:
    return _validator(doc, {"$ref": f"#/components/schemas/{name}"})


class Checker:
    """Sends requests to the live node and checks each answer against the document."""

    def __init__(self, doc: dict[str, Any], http: aiohttp.ClientSession, node: Node) -> None:
        self.doc, self.http, self.node = doc, http, node
        self.seen: set[tuple[str, str, int]] = set()

    def _operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        for template, ops in self.doc["paths"].items():
            pattern = "^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template)) + "$"
            if re.match(pattern, path.split("?")[0]) and method.lower() in ops:
                return template, ops[method.lower()]
        raise AssertionError(f"{method} {path} is not in the document")

    async def __call__(
        self,
        method: str,
        path: str,
        expect: int,
        body: Any = None,
        *,
        token: str | None = "default",
        raw: bytes | None = None,
    ) -> Any:
        headers: dict[str, str] = {}
        if token == "default":
            headers = self.node.headers()
        elif token is not None:
            headers = self.node.headers(token)
        kwargs: dict[str, Any] = {"headers": headers}
        if raw is not None:
            kwargs["data"] = io.BytesIO(raw)
        elif body is not None:
            kwargs["json"] = body
        async with self.http.request(method, self.node.url + path, **kwargs) as r:
            data = await r.read()
            status, content_type = r.status, r.content_type
            retry_after = r.headers.get("Retry-After")
            answered = dict(r.headers)
        assert status == expect, (method, path, status, data[:500])
        template, op = self._operation(method, path)
        documented = op["responses"].get(str(status))
        assert documented is not None, f"{method} {template}: {status} is not documented"
        response = _resolve(self.doc, documented)
        self.seen.add((method, template, status))
        for name, header in response.get("headers", {}).items():
            if header.get("required"):
                assert name in answered, f"{method} {template} {status}: no {name} header"
        if "content" not in response:
            assert data == b"", f"{method} {template} {status}: documented without a body"
            return None
        assert content_type in response["content"], (method, template, status, content_type)
        if content_type == "application/octet-stream":
            return data
        if content_type != "application/json":
            return data.decode()
        value = json.loads(data)
        errors = sorted(
            _validator(self.doc, response["content"][content_type]["schema"]).iter_errors(value),
            key=str,
        )
        assert not errors, f"{method} {template} {status}: {errors[0]}"
        if retry_after is not None:
            assert "Retry-After" in response.get("headers", {}), (method, template, status)
        return value


def _check_events(doc: dict[str, Any], text: str) -> None:
    """Each event's data against the component its kind names."""
    names = {"hello": "StreamStart", "reset": "StreamStart"}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        data = json.loads(fields["data"])
        kind = fields["event"]
        name = names.get(kind, f"{kind.capitalize()}Change")
        for value in [data] if kind in names else data:
            errors = sorted(_component(doc, name).iter_errors(value), key=str)
            assert not errors, f"{kind}: {errors[0]}"


@pytest.fixture
def doc() -> dict[str, Any]:
    return spec()


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)
    assert doc["openapi"].startswith("3.1")
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for path in ("/healthz", "/readyz"):
        assert doc["paths"][path]["get"]["security"] == []


async def test_every_route_is_documented_and_nothing_else(doc: dict[str, Any], node: Node) -> None:
    app = make_app(node.rt.ports())
    routes = {
        (route.method.lower(), route.resource.canonical): route.handler.__name__
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"  # HEAD comes with every GET
    }
    documented = {
        (method, path): op["operationId"]
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    }
    assert routes == documented  # same routes, and each operationId names its handler
    ids = list(documented.values())
    assert len(ids) == len(set(ids))


def test_the_contract_example_body_matches_job_body(doc: dict[str, Any]) -> None:
    found = [p for p in CONTRACTS if p.exists()]
    if not found:
        pytest.skip("no shared contract here")
    text = found[0].read_text()
    example = text.split("Job body (`POST /jobs`)", 1)[1].split("```json", 1)[1].split("```")[0]
    body = json.loads(example.replace('"<job id>"', '"j1"'))
    assert not list(_component(doc, "JobBody").iter_errors(body))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"task": "t", "colour": "red"},
        {"task": "t", "schedule": {"at": "2030-01-01T00:00:00Z", "in": "5m"}},
        {"task": "t", "schedule": {"in": "5m", "overlap": "skip"}},
        {"task": "t", "schedule": {"cron": "* * * * *", "misfire": "sometimes"}},
        {"task": "t", "priority": "urgent"},
        {"task": "t", "retry": {"max_attempts": 0}},
        {"task": "t", "timeout": "soon"},
        {"task": "t", "depends_on": ["a", "a"]},
    ],
)
def test_the_schema_refuses_what_the_server_refuses(doc: dict[str, Any], body: Any) -> None:
    assert list(_component(doc, "JobBody").iter_errors(body))


async def test_live_answers_match_the_document(
    node: Node, http: aiohttp.ClientSession, doc: dict[str, Any]
) -> None:
    node.rt.tokens = TokenStore(
        [(Token("admin", Role.ADMIN), node.token), (Token("viewer", Role.READ), READ_SECRET)]
    )
    call = Checker(doc, http, node)

    # the document itself, for any role; the same as spec()
    served = await call("GET", API + "/openapi.json", 200, token=READ_SECRET)
    assert served == doc
    assert await call("GET", API + "/openapi.json", 200, token=None) == doc  # no token needed
    # a path that is no route is a 404 with or without a token (not a 401 sending the caller
    # looking for one); a route is still a 401 without
    async with http.get(node.url + API + "/nope") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    await call("GET", API + "/jobs", 401, token=None)

    # submissions of every kind of schedule
    cron = {
        "task": "reports.generate",
        "name": "nightly-report",
        "namespace": "default",
        "queue": "default",
        "payload": {"report": "sales"},
        "schedule": {
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "jitter": "5m",
            "misfire": "run_once",
            "catchup_window": "1h",
            "overlap": "skip",
            "dst": {"gap": "shift", "repeat": "first"},
        },
        "priority": "high",
        "retry": {
            "max_attempts": 5,
            "initial": "1s",
            "max": "10m",
            "multiplier": 2,
            "jitter": True,
        },
        "timeout": "30m",
        "heartbeat_timeout": 60,
        "idempotency_key": "nightly",
    }
    job = await call("POST", API + "/jobs", 201, cron)
    again = await call("POST", API + "/jobs", 200, cron)
    assert again["id"] == job["id"]
    later = await call("POST", API + "/jobs", 201, {"task": "t", "schedule": {"in": "1h"}})
    await call(
        "POST", API + "/jobs", 201, {"task": "t", "schedule": {"at": "2030-01-01T00:00:00Z"}}
    )
    every = await call(
        "POST", API + "/jobs", 201, {"task": "t", "schedule": {"every": 90.5}, "timeout": 1.5}
    )
    batch = await call(
        "POST",
        API + "/jobs/batch",
        201,
        {
            "jobs": [
                {"ref": "a", "task": "etl.extract", "schedule": {"in": "1h"}},
                {"task": "etl.load", "depends_on": ["a"]},
            ]
        },
    )
    assert batch["jobs"][1]["depends_on"] == [batch["jobs"][0]["id"]]

    # reads
    page = await call("GET", API + "/jobs?limit=2&status=active&namespace=default", 200)
    assert page["next_cursor"] is not None
    await call("GET", API + f"/jobs?cursor={page['next_cursor']}", 200, token=READ_SECRET)
    await call("GET", API + f"/jobs/{job['id']}", 200)
    await call("GET", API + f"/jobs/{job['id']}/runs", 200)
    out = await call("GET", API + f"/jobs/{job['id']}/explain?count=3", 200)
    assert len(out["fires"]) == 3
    await call("GET", API + f"/jobs/{later['id']}/explain", 200)
    out = await call("GET", API + "/explain?cron=30+2+*+*+*&timezone=Europe/Berlin&count=400", 200)
    assert any(f["note"] for f in out["fires"])
    await call("GET", API + "/explain?every=90s&jitter=5s&dst_gap=skip", 200)

    # changes
    await call("PATCH", API + f"/jobs/{job['id']}", 200, {"paused": True})
    await call(
        "PATCH",
        API + f"/jobs/{every['id']}",
        200,
        {"schedule": {"in": "2h"}, "timeout": None, "retry": {"max_attempts": 2}},
    )
    run = await call("POST", API + f"/jobs/{later['id']}/trigger", 201, {"overlap": "override"})
    await call("GET", API + f"/runs/{run['id']}", 200)
    await call("POST", API + f"/runs/{run['id']}/cancel", 200)
    await call("POST", API + f"/jobs/{later['id']}/trigger", 201)  # no body: respect

    # a worker: leases, a failure into the dead-letter queue, replay, drop
    worker = await connect(http, node, "w1", capacity=2)
    workers = await call("GET", API + "/workers", 200)
    assert [w["worker_id"] for w in workers["workers"]] == ["w1"]
    doomed = [
        await call(
            "POST",
            API + "/jobs",
            201,
            {"task": "t", "queue": "default", "retry": {"max_attempts": 1}},
        )
        for _ in range(2)
    ]
    doomed_ids = {j["id"] for j in doomed}
    failed: list[str] = []
    while len(failed) < 2:
        lease = await worker.expect(messages.Lease)
        if lease.job_id in doomed_ids:
            await worker.send(
                messages.Fail(run_id=lease.run_id, fence=lease.fence, error="boom", retryable=False)
            )
            failed.append(lease.run_id)
        else:
            await worker.send(
                messages.Complete(
                    run_id=lease.run_id, fence=lease.fence, result={"ok": [1, 2.5, None]}
                )
            )

    async def in_dlq() -> bool:
        dlq = await call("GET", API + "/dlq", 200)
        return {r["id"] for r in dlq["runs"]} >= set(failed)

    await wait_for(in_dlq)
    dead = await call("GET", API + f"/runs/{failed[0]}", 200)
    assert dead["attempts"][0]["outcome"] == "failed" and dead["attempts"][0]["error"] == "boom"
    dry = await call("POST", API + "/dlq/replay", 200, {"dry_run": True, "task": "t"})
    assert dry["count"] == 2
    await call("POST", API + f"/dlq/{failed[0]}/replay", 200)
    await call("DELETE", API + f"/dlq/{failed[1]}", 204)
    dropped = await call("POST", API + "/dlq/drop", 200, {"dry_run": False, "run_ids": failed})
    assert dropped["skipped"] == failed  # neither is in the queue any more
    await call("POST", API + "/dlq/drop", 400, {"run_ids": failed})
    drained = await call("POST", API + "/workers/w1/drain", 200)
    assert drained["draining"] is True
    await call("POST", API + "/workers/nobody/drain", 404)
    await call("POST", API + "/workers/w1/drain", 403, token=READ_SECRET)
    await worker.ws.close()

    # the cluster and the operations endpoints
    await call("GET", API + "/cluster", 200)
    stream = await call("GET", API + "/events?follow=false&last_event_id=0", 200, token=READ_SECRET)
    assert "event: hello" in stream and "event: run" in stream
    _check_events(doc, stream)
    lags = await call("GET", API + "/scheduling-lag?minutes=2", 200, token=READ_SECRET)
    assert lags["lease"]["count"] >= 4 and lags["window"] == 120
    await call("GET", API + "/scheduling-lag?minutes=0", 400)
    me = await call("GET", API + "/whoami", 200, token=READ_SECRET)
    assert (me["name"], me["role"]) == ("viewer", "read")
    # schedctl ui: a one-time code for the caller's token, exchanged without a token
    made = await call("POST", API + "/login/codes", 201, {"read_only": True})
    assert made["path"] == f"/ui/#code={made['code']}"
    session = await call("POST", API + "/login", 200, {"code": made["code"]}, token=None)
    assert (session["name"], session["role"]) == ("admin", "read")
    me = await call("GET", API + "/whoami", 200, token=session["token"])
    assert (me["name"], me["role"]) == ("admin", "read")
    await call("POST", API + "/login", 401, {"code": made["code"]}, token=None)  # used
    await call("POST", API + "/login/codes", 403, token=session["token"])  # no renewal
    await call("POST", API + "/login", 400, {"code": 7}, token=None)
    await call("POST", API + "/login/codes", 400, {"read_only": "yes"})
    await call("POST", API + "/login/codes", 401, token=None)
    image = await call("GET", API + "/snapshot", 200)
    assert image.startswith(b"SCHDSNAP")
    await call("GET", API + "/snapshot", 403, token=READ_SECRET)
    await call("GET", "/healthz", 200, token=None)
    await call("GET", "/readyz", 200, token=None)
    assert "schedd" in await call("GET", "/metrics", 200)
    await call("DELETE", API + f"/jobs/{later['id']}", 204)

    # errors
    await call("POST", API + "/jobs", 400, {"task": "t", "schedule": {"cron": "nope"}})
    await call("POST", API + "/jobs", 400, raw=b"{nope")
    await call("POST", API + "/jobs/batch", 400, {"jobs": []})
    await call("PATCH", API + f"/jobs/{job['id']}", 400, {})
    await call("POST", API + f"/jobs/{job['id']}/trigger", 400, {"overlap": "maybe"})
    await call("GET", API + "/jobs?limit=0", 400)
    await call("GET", API + "/explain?count=3", 400)
    await call("GET", API + "/events?types=runs", 400)
    await call("GET", API + "/workers/connect", 400)  # not a websocket upgrade
    await call("GET", API + "/jobs", 401, token=None)
    await call("POST", API + "/jobs", 401, {"task": "t"}, token="wrong-token-0123456789")
    await call("POST", API + "/jobs", 403, {"task": "t"}, token=READ_SECRET)
    await call("DELETE", API + f"/jobs/{job['id']}", 403, token=READ_SECRET)
    await call("GET", API + "/workers/connect", 403, token=READ_SECRET)
    await call("GET", API + "/jobs/nope", 404)
    await call("GET", API + "/jobs/nope/runs", 404)
    await call("GET", API + "/jobs/nope/explain", 404)
    await call("GET", API + "/runs/nope@1", 404)
    await call("PATCH", API + "/jobs/nope", 404, {"paused": True})
    await call("DELETE", API + "/jobs/nope", 404)
    await call("POST", API + "/jobs/nope/trigger", 404)
    await call("POST", API + "/runs/nope@1/cancel", 404)
    await call("POST", API + "/dlq/nope@1/replay", 404)
    await call("DELETE", API + "/dlq/nope@1", 404)
    await call("POST", API + "/jobs", 404, {"task": "t", "depends_on": ["nope"]})
    await call(
        "POST",
        API + "/jobs/batch",
        409,
        {
            "jobs": [
                {"ref": "a", "task": "t", "depends_on": ["b"]},
                {"ref": "b", "task": "t", "depends_on": ["a"]},
            ]
        },
    )
    await call("PATCH", API + f"/jobs/{later['id']}", 409, {"priority": "low"})  # cancelled
    await call("POST", API + f"/jobs/{later['id']}/trigger", 409)
    await call("POST", API + "/jobs", 413, {"task": "t", "payload": "x" * 70_000})
    await call("POST", API + "/jobs/batch", 413, {"jobs": [{"task": "t", "payload": "x" * 70_000}]})
    await call(
        "POST", API + "/jobs", 413, raw=b'{"task": "t", "payload": "' + b"x" * (2 << 20) + b'"}'
    )

    statuses = {s for _, _, s in call.seen}
    assert statuses >= {200, 201, 204, 400, 401, 403, 404, 409, 413}
