"""The HTTP headers the API, the client library, ``schedctl`` and the dashboard share for
reading one's own writes (``docs/api.md``, "Consistency")."""

from __future__ import annotations

from typing import Final

#: on an answer: the Raft index of the entry a write was applied in, or the one a read's node
#: had reached
INDEX_HEADER: Final = "X-Schedd-Index"
#: on a read: answer once the node's reads see at least this index (as ``?min_index=``)
MIN_INDEX_HEADER: Final = "X-Schedd-Min-Index"
#: on a read: ``default`` or ``consistent`` (as ``?consistency=``)
CONSISTENCY_HEADER: Final = "X-Schedd-Consistency"
