"""The leader's loop: claims leadership in the log, keeps the due runs in the timing wheel, fires
them, reserves and leases runs to connected workers, and expires leases.

Owns what only the leader holds in memory (the wheel, the ready queues, the leases, the worker
registry).  May import: core, protocol, raft (to commit commands), metrics, and the foundation
modules; never the API or the runtime.
"""
