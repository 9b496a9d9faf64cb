"""``GET /internal/shard-link`` on a real node: one websocket carrying several workers'
connections to the leader (what a node's front door holds to each shard's leader).  Only a
signed upgrade is taken; each worker said hello for is welcomed, leased runs and acked on it
as on its own connection; a link lost ends every worker connection on it, and their leases
come back to a new link's hellos with ``resume``."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from schedd import clock
from schedd.protocol import messages
from schedd.protocol.signed import LINK_HEADER, LINK_PATH, link_proof
from tests.conftest import Node, wait_for
from tests.integration.test_api import post


def signed(secret: bytes | None = None) -> dict[str, str]:
    at = clock.wall_ms()
    return {LINK_HEADER: f"{at}.{link_proof(secret, at)}"}


class Link:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.got: list[dict[str, Any]] = []

    async def send(self, *envelopes: dict[str, Any]) -> None:
        await self.ws.send_bytes(orjson.dumps(list(envelopes)))

    async def hello(self, w: int, worker_id: str, capacity: int, **kw: Any) -> None:
        hello = messages.Hello(worker_id, ("default",), capacity, **kw)
        await self.send(
            {"w": w, "t": "hello", "f": messages.encode(hello), "node": "n-door", "whole": 9}
        )

    async def frame(self, w: int, msg: messages.Message) -> None:
        await self.send({"w": w, "t": "frame", "f": messages.encode(msg)})

    async def expect(self, w: int, kind: type[messages.Message]) -> Any:
        """The next frame of ``kind`` for worker ``w`` (others are kept in ``got``)."""
        while True:
            for i, env in enumerate(self.got):
                if env.get("w") == w and env.get("t") == "frame":
                    msg = messages.decode(env["f"])
                    if isinstance(msg, kind):
                        del self.got[i]
                        return msg
            frame = await self.ws.receive(timeout=10)
            assert frame.type is aiohttp.WSMsgType.BINARY, frame
            self.got.extend(orjson.loads(frame.data))


async def test_the_link_takes_only_a_signed_upgrade(
    node: Node, http: aiohttp.ClientSession
) -> None:
    async with http.get(node.url + LINK_PATH) as r:
        assert r.status == 400
        assert (await r.json())["error"]["field"] == LINK_HEADER
    stale = {LINK_HEADER: f"1.{link_proof(None, 1)}"}  # an old upgrade (or a replay)
    async with http.get(node.url + LINK_PATH, headers=stale) as r:
        assert r.status == 400
    async with http.get(node.url + LINK_PATH, headers=signed(b"k" * 32)) as r:
        assert r.status == 403  # signed with a secret this node does not have
        assert (await r.json())["error"]["code"] == "permission_denied"


async def test_workers_on_one_link_are_served_and_resume_on_the_next(
    node: Node, http: aiohttp.ClientSession
) -> None:
    ws = await http.ws_connect(node.url + LINK_PATH, headers=signed())
    link = Link(ws)
    first = await ws.receive(timeout=10)
    assert orjson.loads(first.data) == [{"t": "ready"}]
    await link.hello(1, "wa", 1)
    await link.hello(2, "wb", 1)
    for w in (1, 2):
        assert isinstance(await link.expect(w, messages.Welcome), messages.Welcome)
    async with http.get(node.url + "/api/v1/workers", headers=node.headers()) as r:
        listed = {w["worker_id"]: w for w in (await r.json())["workers"]}
    assert set(listed) == {"wa", "wb"}
    ids = []
    for _ in range(2):
        status, job = await post(http, node, "/jobs", {"task": "t"})
        assert status == 201
        ids.append(job["id"])
    a = await link.expect(1, messages.Lease)
    b = await link.expect(2, messages.Lease)  # each worker one (capacity 1)
    assert {a.job_id, b.job_id} == set(ids)
    await link.frame(1, messages.Complete(a.run_id, a.fence, result={"ok": 1}))
    ack = await link.expect(1, messages.Ack)
    assert ack.run_id == a.run_id and ack.accepted
    # the link is lost with b's lease held: a new link's hello with resume keeps it
    await ws.close()
    ws = await http.ws_connect(node.url + LINK_PATH, headers=signed())
    link = Link(ws)
    assert orjson.loads((await ws.receive(timeout=10)).data) == [{"t": "ready"}]
    await link.hello(7, "wb", 1, resume=(messages.LeaseRef(b.run_id, b.fence),))
    await link.expect(7, messages.Welcome)
    await link.frame(7, messages.Complete(b.run_id, b.fence, result={"ok": 2}))
    ack = await link.expect(7, messages.Ack)
    assert ack.run_id == b.run_id and ack.accepted

    async def both_succeeded() -> bool:
        for job_id in ids:
            async with http.get(node.url + f"/api/v1/jobs/{job_id}", headers=node.headers()) as r:
                if (await r.json())["latest_run"]["state"] != "succeeded":
                    return False
        return True

    await wait_for(both_succeeded, 10)  # (the acks come once committed; the reads follow)
    # a worker's bye ends its connection (the leader lists it no more)
    await link.send({"w": 7, "t": "bye"})

    async def unlisted() -> bool:
        async with http.get(node.url + "/api/v1/workers", headers=node.headers()) as r:
            return not (await r.json())["workers"]

    await wait_for(unlisted, 10)
    await ws.close()


async def test_a_worker_said_hello_for_on_another_link_is_told_bye_on_the_first(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """The leader keeps one connection per worker: a newer one takes its place, and the link
    that carried the older hears ``bye`` for it (its front door says hello again later)."""
    links = []
    for _ in range(2):
        ws = await http.ws_connect(node.url + LINK_PATH, headers=signed())
        assert orjson.loads((await ws.receive(timeout=10)).data) == [{"t": "ready"}]
        links.append(Link(ws))
    await links[0].hello(1, "w-same", 1)
    await links[0].expect(1, messages.Welcome)
    await links[1].hello(5, "w-same", 1)
    await links[1].expect(5, messages.Welcome)
    while not any(e.get("w") == 1 and e.get("t") == "bye" for e in links[0].got):
        frame = await links[0].ws.receive(timeout=10)
        assert frame.type is aiohttp.WSMsgType.BINARY, frame
        links[0].got.extend(orjson.loads(frame.data))
    for link in links:
        await link.ws.close()
