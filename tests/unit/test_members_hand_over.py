"""Removing the leader through the API (``DELETE /cluster/nodes/ID`` on the leader itself): it
hands its leadership over, then asks the next leader to remove it.  That leader, elected a
moment ago, answers 503 ("just elected and is starting") until its claim is committed: the
removed leader asks again until ``HAND_OVER_WAIT_S`` instead of passing that 503 on - the
operator's ``schedctl node remove`` would fail although the hand-over was made (seen in
tests/cluster/test_membership_netns.py).  Any other answer is passed on as it is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from schedd.api import members
from schedd.api.ports import MEMBERS, PROXY, RAFT

STARTING = {
    "error": {"code": "unavailable", "message": "this node was just elected and is starting"}
}
REMOVED = {"index": 9, "nodes": [], "removed": ["10.0.0.1:7701"], "quorum": 2}


class Leader:
    is_leader = True


class HandsOver:
    async def remove(self, ref: str) -> None:
        return None  # this node: it handed over (MembershipService.remove)


class NextLeader:
    """The leader this node handed over to, answering from a script (the last answer again
    once the script is through)."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str, float]] = []

    async def forward(
        self, request: web.Request, method: str, path: str, body: Any = None, wait: float = 0.0
    ) -> tuple[int, Any]:
        self.asked.append((method, path, wait))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def next_leader() -> NextLeader:
    return NextLeader()


@pytest.fixture
async def client(
    next_leader: NextLeader,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    app[RAFT] = Leader()  # type: ignore[assignment]
    app[MEMBERS] = HandsOver()  # type: ignore[assignment]
    app[PROXY] = next_leader  # type: ignore[assignment]
    app.router.add_delete(members.NODES + "/{node}", members.remove_node)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_the_next_leader_is_asked_again_while_it_starts(
    client: TestClient[web.Request, web.Application], next_leader: NextLeader
) -> None:
    next_leader.answers = [(503, STARTING), (503, STARTING), (200, REMOVED)]
    r = await client.delete(members.NODES + "/n1")
    assert r.status == 200 and await r.json() == REMOVED
    assert [(m, p) for m, p, _ in next_leader.asked] == [("DELETE", members.NODES + "/n1")] * 3
    waits = [w for _, _, w in next_leader.asked]
    assert waits[0] <= members.HAND_OVER_WAIT_S and waits == sorted(waits, reverse=True)


@pytest.mark.parametrize("status", [200, 404, 409])
async def test_any_other_answer_is_passed_on_at_once(
    client: TestClient[web.Request, web.Application], next_leader: NextLeader, status: int
) -> None:
    answer = REMOVED if status == 200 else {"error": {"code": "x", "message": str(status)}}
    next_leader.answers = [(status, answer)]
    r = await client.delete(members.NODES + "/n1")
    assert r.status == status and await r.json() == answer
    assert len(next_leader.asked) == 1


async def test_a_leader_that_never_gets_going_is_a_503_after_the_wait(
    client: TestClient[web.Request, web.Application],
    next_leader: NextLeader,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(members, "HAND_OVER_WAIT_S", 0.5)
    monkeypatch.setattr(members, "HAND_OVER_RETRY_S", 0.05)
    next_leader.answers = [(503, STARTING)]
    r = await client.delete(members.NODES + "/n1")
    assert r.status == 503 and await r.json() == STARTING
    assert 2 <= len(next_leader.asked) <= 11
