"""Connected workers as the leader sees them: queues, capacity, leases held, an outbox."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from schedd.protocol import messages


@dataclass(eq=False)
class WorkerConn:
    worker_id: str
    queues: tuple[str, ...]
    capacity: int
    connected_at_ms: int
    tasks: frozenset[str] | None = None  # the tasks it runs (None: any)
    node: str = ""  # the node whose websocket it holds (the leader)
    host: str | None = None  # the address it connects from, as that node sees it
    heard_ms: int = 0  # when a frame last came from it (a heartbeat, a result; wall clock)
    outbox: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    leases: dict[str, int] = field(default_factory=dict)  # run_id -> fence
    reserved: int = 0  # leases being committed for this worker
    draining: bool = False
    closed: bool = False
    #: it let a lease expire while its connection stayed open (stopped, or cut off by a
    #: partition that leaves the socket hanging): no new lease reaches it until a frame comes
    #: from it again, or every lease dispatched to it would be lost the same way
    silent: bool = False
    #: the worker's whole capacity when a node's front door serves it from several shards
    #: (``capacity`` is then this shard's share, which the front door moves)
    whole_capacity: int | None = None

    @property
    def free(self) -> int:
        if self.draining or self.closed or self.silent:
            return 0
        return self.capacity - len(self.leases) - self.reserved

    def send(self, msg: messages.Message) -> None:
        if not self.closed:
            self.outbox.put_nowait(messages.encode(msg))

    def close(self, discard: bool = False) -> None:
        """Ask the connection's writer to close the socket, after the frames queued for it or,
        with ``discard``, dropping them (a connection replaced by a newer one of the same
        worker: what it has not sent yet must never reach the worker)."""
        if not self.closed:
            self.closed = True
            if discard:
                while not self.outbox.empty():
                    self.outbox.get_nowait()
            self.outbox.put_nowait(None)


@dataclass(slots=True, eq=False)
class LeaseProgress:
    """A lease's progress reports, as the leader records them (``schedd.leader.progress``)."""

    recorded: bytes | None = None  # what the attempt holds, or will once the commit applies
    value: Any = None  # the latest value reported and not recorded yet ...
    waiting: bytes | None = None  # ... as canonical JSON (None: nothing waits)
    after: float = 0.0  # monotonic: no progress of this lease is committed before then
    queued: bool = False  # waiting in the book's queue for ``after``
    warned: bool = False  # a value too large to keep was logged (once per lease)


@dataclass(slots=True)
class LeaseInfo:
    run_id: str
    fence: int
    worker_id: str
    expires: float  # monotonic: heartbeats must arrive before this
    heartbeat_timeout: float  # seconds
    deadline_ms: int | None  # the run's timeout (wall clock), if any
    ending: bool = False  # a Fail/expiry for this lease is being committed
    progress: LeaseProgress | None = None  # once the worker reports progress (or one is held)
