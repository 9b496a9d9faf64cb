"""When the node's database makes applied entries visible to the API's readers.

A client's own write is visible before it is answered; the leader's own commands (fires,
leases) and the workers' results wait in the open transaction for up to ``LAZY_COMMIT_S``, so a
run fired, leased and finished meanwhile has its row written once, not three times."""

from __future__ import annotations

import aiohttp
import pytest

from schedd.core import commands
from schedd.core.model import JobSpec
from schedd.core.state import Ok, Rejected
from schedd.errors import Code
from schedd.protocol import messages
from schedd.raft import node as raft_node
from tests.conftest import Node, wait_for
from tests.integration.test_worker_protocol import connect, runs, submit

T0 = 1_800_000_000_000


async def test_worker_driven_changes_wait_for_the_next_commit_and_are_written_once(
    lazy_node: Node, http: aiohttp.ClientSession
) -> None:
    node = lazy_node
    rt = node.rt
    db = rt.node._sm.state.db
    writes: list[str] = []
    db.set_trace_callback(lambda sql: writes.append(sql) if sql.startswith("UPDATE runs") else None)
    try:
        w = await connect(http, node, "w-lazy")
        before = rt.node.applied_index
        job = await submit(http, node, {"task": "t"})
        # a client's write is visible when it is answered, on a connection of its own
        assert rt.node.state_index > before
        [run] = await runs(http, node, job["id"])
        assert run["state"] == "scheduled"  # as submitted: a fire would not be written yet
        lease = await w.expect(messages.Lease, timeout=10)
        await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
        assert (await w.expect(messages.Ack)).accepted
        with rt.node.read() as st:  # the node itself reads its open transaction
            assert st.runs[lease.run_id].state.value == "succeeded"
        assert rt.node.state_index < rt.node.applied_index
        [run] = await runs(http, node, job["id"])
        assert run["state"] != "succeeded"  # the API's reader sees the last commit
        assert [s for s in writes if lease.run_id.split("@")[0] in s] == []
        done = rt.node.applied_index  # the result's entry, and all before it
        other = await submit(http, node, {"task": "t", "schedule": {"in": "1h"}})
        assert rt.node.state_index > done
        [run] = await runs(http, node, job["id"])
        assert run["state"] == "succeeded"
        # fired, leased and finished: one row write
        assert len([s for s in writes if lease.run_id.split("@")[0] in s]) == 1, writes
        [pending] = await runs(http, node, other["id"])  # the commit's own client write
        assert pending["state"] == "scheduled"
        await w.ws.close()
    finally:
        db.set_trace_callback(None)


async def test_an_idle_node_commits_once_the_window_has_passed(
    node: Node, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = node.rt
    monkeypatch.setattr(raft_node, "LAZY_COMMIT_S", 3600.0)
    w = await connect(http, node, "w-idle")
    job = await submit(http, node, {"task": "t"})
    lease = await w.expect(messages.Lease, timeout=10)
    await w.send(messages.Complete(run_id=lease.run_id, fence=lease.fence))
    assert (await w.expect(messages.Ack)).accepted
    assert rt.node.state_index < rt.node.applied_index
    monkeypatch.setattr(raft_node, "LAZY_COMMIT_S", 0.05)
    # nothing more is applied: a tick with nothing to do commits
    await wait_for(lambda: rt.node.state_index == rt.node.applied_index, timeout=5)
    [run] = await runs(http, node, job["id"])
    assert run["state"] == "succeeded"
    await w.ws.close()


async def test_a_failure_to_hand_on_the_leader_events_does_not_stop_the_node(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The events are handed on at the end of a tick, outside the apply's own guard: an error
    # there (the event loop closing while the node stops) must not reach pysyncobj's tick,
    # which would drop the answers of that tick's entries.
    def broken(batch: object) -> None:
        raise RuntimeError("Event loop is closed")

    monkeypatch.setattr(node.rt.node.hooks, "on_applied", broken)
    for k in range(3):  # each one's due event goes to the broken hook
        job = (f"J-broken-{k}", JobSpec(task="t"))
        result = await node.rt.node.submit(
            commands.Submit(f"r-broken-{k}", T0, (job,)), timeout=3.0
        )
        assert isinstance(result, Ok), result
    with node.rt.node.read() as st:
        assert [st.jobs[f"J-broken-{k}"].status.value for k in range(3)] == ["active"] * 3


async def test_a_follower_commits_a_clients_command_at_once_only_if_a_caller_waits_there(
    lazy_node: Node, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follower applies a client's command that a caller on another node waits for: nobody
    # was told about it here, so it waits for the next commit like the leader's own commands.
    # (The node plays a follower's state machine; the command, proposed here without a
    # callback, has no caller on this node.)
    rt = lazy_node.rt
    monkeypatch.setattr(rt.node._sm, "leading", lambda: False)
    await submit(http, lazy_node, {"task": "t", "schedule": {"in": "1h"}})
    assert rt.node.state_index == rt.node.applied_index
    before = rt.node.applied_index
    blob = commands.encode_entry(
        [commands.Submit("r-unwatched", T0, (("J-unwatched", JobSpec(task="t")),))]
    )
    rt.node._sm.apply_entry(blob)  # no callback: no caller waits
    await wait_for(lambda: rt.node.applied_index > before, timeout=5)
    with rt.node.read() as st:
        assert "J-unwatched" in st.jobs
    assert rt.node.state_index == before
    assert await rt.reader.job("J-unwatched") is None
    # the next command a caller here waits for commits both
    job = await submit(http, lazy_node, {"task": "t", "schedule": {"in": "1h"}})
    assert rt.node.state_index == rt.node.applied_index
    assert await rt.reader.job("J-unwatched") is not None
    assert await rt.reader.job(job["id"]) is not None
    # the leader commits every client's command at once: a client answered by any node then
    # finds its write on the leader
    monkeypatch.setattr(rt.node._sm, "leading", lambda: True)
    before = rt.node.applied_index
    blob = commands.encode_entry([commands.Submit("r-led", T0, (("J-led", JobSpec(task="t")),))])
    rt.node._sm.apply_entry(blob)
    await wait_for(lambda: rt.node.state_index > before, timeout=5)
    assert await rt.reader.job("J-led") is not None


async def test_an_apply_that_fails_answers_its_caller_with_the_rejection(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An exception inside the apply must not escape into pysyncobj's tick (docs/pysyncobj.md
    # #1); the command's caller gets an internal rejection, with the entry's index.
    real = raft_node.apply_entry

    def broken(*args: object, **kwargs: object) -> object:
        monkeypatch.setattr(raft_node, "apply_entry", real)  # once
        raise RuntimeError("the disk said no")

    monkeypatch.setattr(raft_node, "apply_entry", broken)
    job = ("J-apply-fails", JobSpec(task="t"))
    before = node.rt.node.applied_index
    result, entry, _ = await node.rt.node.submit_indexed(
        commands.Submit("r-apply-fails", T0, (job,)), timeout=3.0
    )
    assert isinstance(result, Rejected) and result.code is Code.INTERNAL
    assert "the disk said no" in result.message and entry > before
