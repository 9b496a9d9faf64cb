"""The leader's loop: claims leadership in the log, keeps the due runs in the timing wheel, fires
them, reserves and leases runs to connected workers, and expires leases.

``core`` decides (time and events in, typed actions out, no I/O: scenario-tested on its own);
``leader`` is the asyncio shell that feeds it the clocks, Raft's results and the workers'
frames, and carries out its actions; ``workers`` is a connected worker as both see it.

Owns what only the leader holds in memory (the wheel, the ready queues, the leases, the worker
registry).  May import: core, protocol, raft (to commit commands), metrics, and the foundation
modules; never the API or the runtime.
"""
