"""The HTTP headers the API, the client library, ``schedctl`` and the dashboard share for
reading one's own writes (``docs/api.md``, "Consistency"), and those a node's front door
adds when it passes a request on to one of its shards."""

from __future__ import annotations

from typing import Final

#: on an answer: the Raft index of the entry a write was applied in, or the one a read's node
#: had reached
INDEX_HEADER: Final = "X-Schedd-Index"
#: on a read: answer once the node's reads see at least this index (as ``?min_index=``)
MIN_INDEX_HEADER: Final = "X-Schedd-Min-Index"
#: on a read: ``default`` or ``consistent`` (as ``?consistency=``)
CONSISTENCY_HEADER: Final = "X-Schedd-Consistency"

#: a request for one shard of a cluster of several (a node's process of that shard asking the
#: node that leads it): the node's front door passes it to that shard alone
SHARD_HEADER: Final = "X-Schedd-Shard"
#: on a node's answer to ``GET /api/v1/snapshot`` (a cluster of several shards): how many
#: shards the cluster has (the answer is shard 0's image; ask each other one by its number)
SHARDS_HEADER: Final = "X-Schedd-Shards"
