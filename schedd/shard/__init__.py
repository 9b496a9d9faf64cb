"""Shards: several Raft groups over the same nodes, each in a process of its own.

A node of a cluster of ``cluster.shards`` > 1 is a *supervisor* (:mod:`schedd.shard.supervisor`)
that starts one process per shard (:mod:`schedd.shard.main`), each a whole schedd node of its
shard's Raft group (:func:`schedd.shard.layout.shard_config`), serving its API on a socket of
the node's own; and a *front door* (:mod:`schedd.shard.frontdoor`) on ``http.listen`` that
sends each request to the shard it concerns and merges the listings of all of them.
"""
