"""Issue 4 (security), "bad input": schemathesis against the OpenAPI description served by a live
one-node cluster finds no 5xx and no accepted invalid body.

Every operation of ``GET /api/v1/openapi.json``, as the running node serves it, gets a bounded
number of schemathesis-generated valid requests and, where it has a body, a query or a header
to get wrong, as many requests that violate the schema.  Each answer is checked for:

* ``not_a_server_error``: never a 5xx;
* ``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``,
  ``response_headers_conformance``: the status is documented for the operation, and so are
  the content type, the body and the headers (Retry-After) that come with it;
* ``negative_data_rejection``: a request that violates the schema gets a 4xx, never a 2xx.

Path ids are replaced by real ones, or the server would answer 404 before it reads the body:
the reads and changes of one job use jobs of every kind of schedule (one paused, one done, one
dead); cancelling a job, cancelling a run, replaying and dropping a dead-lettered run each get
a fresh victim, so destructive calls never turn later cases into 404s or 409s.  A worker on the
node completes the runs of the ``done`` queue and fails those of ``doomed``, so runs with
attempts, results and errors (and the dead-letter queue) are there to read.

The node has an event loop of its own in a thread: schemathesis calls the API synchronously
(``requests``) from the test's thread.  The cases come from ``APIOperation.as_strategy`` under
``@given`` rather than ``schemathesis.pytest.from_fixture``, whose lazy loader (4.32) reads
``Function._nodeid``, an attribute pytest 9.2 no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from schedd.api.openapi import spec
from schedd.protocol import messages
from tests.conftest import Node, start_node
from tests.integration.test_worker_protocol import RawWorker

API = "/api/v1"
# Per operation and mode; derandomized, so CI sends the same cases every run.  Raise it for a
# deeper local run: SCHEDD_FUZZ_EXAMPLES=1000 pytest tests/integration/test_schemathesis.py
MAX_EXAMPLES = int(os.environ.get("SCHEDD_FUZZ_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
T = TypeVar("T")

pytestmark = pytest.mark.filterwarnings(
    # The node runs in a thread of this process and draws from the global `random` (Raft
    # election timeouts, retry jitter) while Hypothesis generates a case; Hypothesis takes the
    # changed global state for a strategy that uses `random`.
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning",
)


class _Loop:
    """An event loop in a thread of its own, for the node."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="schedd-node", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        with contextlib.suppress(Exception):
            self.run(drain(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _work(worker: RawWorker) -> None:
    """Complete every lease of the ``done`` queue, fail (not retryable) those of ``doomed``."""
    while True:
        msg = await worker.recv(timeout=3600)
        if not isinstance(msg, messages.Lease):
            continue
        if msg.task.startswith("doomed"):
            await worker.send(
                messages.Fail(run_id=msg.run_id, fence=msg.fence, error="boom", retryable=False)
            )
        else:
            await worker.send(
                messages.Complete(run_id=msg.run_id, fence=msg.fence, result={"ok": [1, 2.5, None]})
            )


class Live:
    """The node, a worker on it, and the real ids that generated cases are pointed at."""

    def __init__(self, tmp: Path) -> None:
        self.loop = _Loop()
        self.node: Node | None = None
        self.http: aiohttp.ClientSession | None = None
        self.worker: RawWorker | None = None
        self.drainee: RawWorker | None = None
        self.work: asyncio.Task[None] | None = None
        self.session = requests.Session()
        self.tmp = tmp
        self._learners = 0  # nodes added (never started) for the remove_node cases

    # -- set up / tear down ---------------------------------------------------------------------
    def start(self) -> None:
        self.node = self.loop.run(start_node(self.tmp / "n1"))
        self.auth = {"Authorization": f"Bearer {self.node.token}"}
        self.session.headers.update(self.auth)
        self.loop.run(self._connect_worker())
        self.jobs = [
            self.submit(body)["id"]
            for body in (
                {
                    "task": "reports.generate",
                    "schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
                },
                {"task": "t", "schedule": {"every": "90s", "jitter": "5s", "overlap": "allow"}},
                {"task": "t", "schedule": {"in": "1h"}},
                {"task": "t", "schedule": {"at": "2030-01-01T00:00:00Z"}},
                {"task": "t", "queue": "nobody"},  # run now, never leased: stays pending
                {"task": "t", "queue": "done"},
                {"task": "doomed", "queue": "doomed", "retry": {"max_attempts": 1}},
            )
        ]
        self.call("PATCH", f"/jobs/{self.jobs[1]}", {"paused": True})
        runs = [self.wait_run(self.jobs[5], "succeeded"), self.wait_run(self.jobs[6], "failed")]
        runs += [self.call("GET", f"/jobs/{j}")["latest_run"]["id"] for j in self.jobs[:5]]
        self._jobs, self._runs = itertools.cycle(self.jobs), itertools.cycle(runs)

    async def _connect_worker(self) -> None:
        assert self.node is not None
        self.http = aiohttp.ClientSession()
        ws = await self.http.ws_connect(
            self.node.url + API + "/workers/connect", headers=self.node.headers()
        )
        self.worker = RawWorker(ws)
        await self.worker.send(
            messages.Hello(worker_id="w1", queues=("done", "doomed"), capacity=4)
        )
        await self.worker.expect(messages.Welcome)
        self.work = asyncio.create_task(_work(self.worker))
        # a worker of its own for the drain cases: w1 must go on taking work
        ws = await self.http.ws_connect(
            self.node.url + API + "/workers/connect", headers=self.node.headers()
        )
        self.drainee = RawWorker(ws)
        await self.drainee.send(messages.Hello(worker_id="drainee", queues=("idle",), capacity=1))
        await self.drainee.expect(messages.Welcome)

    async def _disconnect_worker(self) -> None:
        if self.work is not None:
            self.work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.work
        if self.worker is not None:
            await self.worker.ws.close()
        if self.drainee is not None:
            await self.drainee.ws.close()
        if self.http is not None:
            await self.http.close()

    def stop(self) -> None:
        try:
            self.session.close()
            with contextlib.suppress(Exception):
                self.loop.run(self._disconnect_worker())
            if self.node is not None:
                self.loop.run(self.node.rt.stop())
        finally:
            self.loop.close()

    # -- plain calls from the test's thread -----------------------------------------------------
    @property
    def url(self) -> str:
        assert self.node is not None
        return self.node.url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.session.request(method, self.url + API + path, json=body, timeout=30)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else None

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        job: dict[str, Any] = self.call("POST", "/jobs", body)
        return job

    def wait_run(self, job_id: str, state: str, timeout: float = 15.0) -> str:
        """The id of the job's latest run once it is in ``state`` (polled from this thread: the
        node's loop must stay free to answer)."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.call("GET", f"/jobs/{job_id}")["latest_run"]
            if run is not None and run["state"] == state:
                return str(run["id"])
            assert time.monotonic() < deadline, f"job {job_id}: no {state} run within {timeout}s"
            time.sleep(0.02)

    # -- what a case's path ids become ----------------------------------------------------------
    def fresh_job(self) -> str:
        return str(self.submit({"task": "t", "schedule": {"in": "1h"}})["id"])

    def fresh_run(self) -> str:
        return str(self.submit({"task": "t", "schedule": {"in": "1h"}})["latest_run"]["id"])

    def fresh_dead_run(self) -> str:
        job = self.submit({"task": "doomed", "queue": "doomed", "retry": {"max_attempts": 1}})
        return self.wait_run(job["id"], "failed")

    def fresh_learner(self) -> str:
        """A node being added (never started): removing it calls its add off."""
        view = self.call("GET", "/cluster/nodes")
        joining = [n["raft"] for n in view["nodes"] if n["role"] == "learner"]
        if joining:
            return str(joining[0])
        self._learners += 1
        addr = f"127.0.0.1:{31000 + self._learners}"
        self.call("POST", "/cluster/nodes", {"raft": addr})
        return addr

    def _reachable_min_index(self, case: schemathesis.Case[Any]) -> None:
        """A valid min_index beyond what the node applied waits READ_WAIT_S and is a 503 by
        design (tests/integration/test_read_your_writes.py): one it has reached is sent."""
        assert self.node is not None
        applied = self.node.rt.node.applied_index
        for values, name in ((case.query, "min_index"), (case.headers, "X-Schedd-Min-Index")):
            if not isinstance(values, MutableMapping) or name not in values:
                continue
            try:
                wanted = int(values[name])
            except (TypeError, ValueError):
                continue
            if wanted > applied:
                values[name] = str(applied) if isinstance(values[name], str) else applied

    def prepare(self, case: schemathesis.Case[Any], mode: GenerationMode) -> None:
        """Point the case's path ids at real objects (a fresh one for destructive calls); an
        event stream that would follow forever ends once it has sent what the node holds."""
        if case.operation.path == f"{API}/login" and isinstance(case.body, dict):
            # a valid exchange needs a code the node made (a made-up one is a 401)
            if isinstance(case.body.get("code"), str) and mode is GenerationMode.POSITIVE:
                case.body["code"] = self.call("POST", "/login/codes", {})["code"]
        self._reachable_min_index(case)
        if case.operation.path == f"{API}/events":
            query = case.query if isinstance(case.query, dict) else {}
            # (a bad case may be bad elsewhere, an unknown parameter say, with follow=true:
            # it would follow until the client's read timeout)
            if mode is GenerationMode.POSITIVE or query.get("follow", "true") in ("true", True):
                query["follow"] = "false"
            case.query = query
        fresh: dict[tuple[str, str], Callable[[], str]] = {
            ("DELETE", f"{API}/jobs/{{job_id}}"): self.fresh_job,
            ("POST", f"{API}/runs/{{run_id}}/cancel"): self.fresh_run,
            ("POST", f"{API}/dlq/{{run_id}}/replay"): self.fresh_dead_run,
            ("DELETE", f"{API}/dlq/{{run_id}}"): self.fresh_dead_run,
        }
        if "node" in (case.path_parameters or {}):
            case.path_parameters["node"] = self.fresh_learner()
        params = case.path_parameters
        if not params:
            return
        if "worker_id" in params:
            params["worker_id"] = "drainee"
        make = fresh.get((case.operation.method.upper(), case.operation.path))
        for name, pool in (("job_id", self._jobs), ("run_id", self._runs)):
            if name in params:
                params[name] = make() if make is not None else next(pool)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    out = Live(tmp_path_factory.mktemp("schemathesis"))
    try:
        out.start()
        yield out
    finally:
        out.stop()


@pytest.fixture(scope="module")
def api_schema(live: Live) -> Any:
    """The document, as the live node serves it."""
    assert live.node is not None
    config = schemathesis.Config.from_dict(
        {
            # the token is sent with every call; a generated Authorization would only get 401s
            "generation": {"with-security-parameters": False, "database": "none"},
            # a request that violates the schema must get a 4xx: nothing else (a 5xx is
            # not_a_server_error's business)
            "checks": {"negative_data_rejection": {"expected-statuses": ["4xx"]}},
        }
    )
    return schemathesis.openapi.from_url(
        live.url + API + "/openapi.json", config=config, headers=live.auth, timeout=30
    )


def _cases() -> list[Any]:
    """(operationId, mode) for every operation: valid requests, and invalid ones where the
    operation has something to get wrong (a body, a query parameter or a header; the path ids
    are plain strings and replaced by real ones anyway)."""
    doc = spec()
    out = []
    for ops in doc["paths"].values():
        for op in ops.values():
            out.append(
                pytest.param(
                    op["operationId"], GenerationMode.POSITIVE, id=f"{op['operationId']}-valid"
                )
            )
            params = [
                doc["components"]["parameters"][p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p
                for p in op.get("parameters", ())
            ]
            if "requestBody" in op or any(p["in"] != "path" for p in params):
                out.append(
                    pytest.param(
                        op["operationId"],
                        GenerationMode.NEGATIVE,
                        id=f"{op['operationId']}-invalid",
                    )
                )
    return sorted(out, key=lambda p: str(p.id))


CASES = _cases()
OPERATIONS = sorted({p.values[0] for p in CASES})


def test_every_operation_is_tested(api_schema: Any) -> None:
    served = {
        op["operationId"] for ops in api_schema.raw_schema["paths"].values() for op in ops.values()
    }
    assert served == set(OPERATIONS)


@pytest.mark.parametrize(("operation_id", "mode"), CASES)
def test_bad_input(api_schema: Any, live: Live, operation_id: str, mode: GenerationMode) -> None:
    operation = api_schema.find_operation_by_id(operation_id)
    strategy = operation.as_strategy(generation_mode=mode)

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )
    @given(case=strategy)
    def run(case: schemathesis.Case[Any]) -> None:
        live.prepare(case, mode)
        response = case.call_and_validate(
            session=live.session, headers=live.auth, checks=CHECKS, timeout=30
        )
        statuses[response.status_code] += 1

    statuses: Counter[int] = Counter()
    run()
    # the cases got past authentication and the id lookups into the handlers' own checks
    assert not statuses.keys() & {401, 403}, statuses
    if "{" in operation.path:
        assert 404 not in statuses, statuses
    if mode is GenerationMode.NEGATIVE:
        assert statuses[400], statuses


@pytest.mark.parametrize("query", ["queue=", "namespace=Default", "namespace=%0E", "queue=a%2Fb"])
def test_list_filters_outside_ident_are_refused(live: Live, query: str) -> None:
    r = live.session.get(f"{live.url}{API}/jobs?{query}", timeout=30)
    assert r.status_code == 400, (r.status_code, r.text)
