"""A worker's ``hello.resume`` lists every lease it holds (schedd/worker/client.py), and its
socket is one connection at a time: a lease the leader recorded for that worker id which the
hello does not list never reached it and never will.  The leader ends such a lease the moment
the worker connects (lost: retried with a new fence), instead of after the heartbeat timeout or
a new leader's rebuild grace, max(heartbeat timeout, 10 s), 60 s here (the default)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from schedd.protocol import messages
from tests.conftest import Node, restart_leader_in_new_term
from tests.integration.test_worker_protocol import committed, committed_runs, connect, runs, submit

# The default heartbeat timeout (60 s) and so the rebuild grace (60 s) are far above this: a
# lease ended within it was ended by the reconnection, not by its expiry.
PROMPT_S = 10.0
RETRY = {"initial": "0.05s", "jitter": False}


async def test_a_lease_the_reconnecting_worker_does_not_list_is_ended_at_once(
    node: Node, http: aiohttp.ClientSession
) -> None:
    w = await connect(http, node, "w1")
    job = await submit(http, node, {"task": "t", "retry": RETRY})
    lost = await w.expect(messages.Lease)
    await w.ws.close()  # as if the lease frame had been lost with the socket
    again = await connect(http, node, "w1", resume=())
    frames: list[messages.Message] = []
    while not any(isinstance(f, messages.Lease) for f in frames):
        frames.append(await again.recv(timeout=PROMPT_S))
    retry = frames[-1]
    assert isinstance(retry, messages.Lease)
    assert retry.run_id == lost.run_id and retry.fence > lost.fence and retry.attempt == 2
    # the old fence is cancelled on the new socket before the retry's lease
    cancels = [f for f in frames if isinstance(f, messages.Cancel)]
    assert [(c.run_id, c.fence) for c in cancels] == [(lost.run_id, lost.fence)]
    await again.send(messages.Complete(run_id=retry.run_id, fence=retry.fence))
    assert (await again.expect(messages.Ack)).accepted
    [run] = await committed_runs(http, node, job["id"])
    assert run["state"] == "succeeded"
    first, second = run["attempts"]
    assert first["outcome"] == "lost" and "reconnected without it" in first["error"]
    assert first["fence"] == lost.fence and second["outcome"] == "succeeded"
    await again.ws.close()


async def test_a_new_leader_ends_only_the_leases_the_worker_does_not_resume(
    node: Node, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's case (S5): the old leader committed a lease whose frame never reached the
    worker.  Only that one is ended when the worker says hello to the new leader: the one it
    lists is resumed, and another worker's lease (not connected yet) is left alone."""
    w1 = await connect(http, node, "w1", capacity=2)
    jobs = [await submit(http, node, {"task": "t", "retry": RETRY}) for _ in range(2)]
    kept, lost = sorted(
        [await w1.expect(messages.Lease), await w1.expect(messages.Lease)],
        key=lambda lease: lease.run_id,
    )
    w2 = await connect(http, node, "w2", capacity=1)
    other_job = await submit(http, node, {"task": "t", "retry": RETRY})
    other = await w2.expect(messages.Lease)
    assert other.job_id == other_job["id"]

    # A new leader (a new claim in a new term, rebuilt from the state): as after a failover.
    rt: Any = node.rt
    await restart_leader_in_new_term(rt, monkeypatch)
    assert len(rt.leader.leases) == 3  # all three rebuilt, each with the 60 s grace

    again = await connect(
        http,
        node,
        "w1",
        capacity=2,
        resume=(messages.LeaseRef(run_id=kept.run_id, fence=kept.fence),),
    )
    retry = await again.expect(messages.Lease, timeout=PROMPT_S)
    assert retry.run_id == lost.run_id and retry.fence > lost.fence and retry.attempt == 2

    await committed(node)
    by_run = {r["id"]: r for j in [*jobs, other_job] for r in await runs(http, node, j["id"])}
    assert [a["outcome"] for a in by_run[lost.run_id]["attempts"]] == ["lost", None]
    # resumed: still its first attempt, still running, its result accepted
    assert [a["outcome"] for a in by_run[kept.run_id]["attempts"]] == [None]
    assert by_run[kept.run_id]["state"] == "running"
    # another worker's lease is not touched by w1's hello
    assert [a["outcome"] for a in by_run[other.run_id]["attempts"]] == [None]
    assert rt.leader.leases[other.run_id].worker_id == "w2"
    assert rt.leader.core.by_worker == {"w1": {kept.run_id, retry.run_id}, "w2": {other.run_id}}
    await again.send(messages.Complete(run_id=kept.run_id, fence=kept.fence))
    assert (await again.expect(messages.Ack)).accepted
    w2_again = await connect(
        http,
        node,
        "w2",
        capacity=1,
        resume=(messages.LeaseRef(run_id=other.run_id, fence=other.fence),),
    )
    await w2_again.send(messages.Complete(run_id=other.run_id, fence=other.fence))
    assert (await w2_again.expect(messages.Ack)).accepted
    [run] = await committed_runs(http, node, other_job["id"])
    assert run["state"] == "succeeded" and len(run["attempts"]) == 1
    for w in (w1, w2, again, w2_again):
        await w.ws.close()
