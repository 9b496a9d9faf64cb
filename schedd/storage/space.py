"""How much room the filesystem holding a path has: named in the log line of a node that stops
because a write failed, so that a full disk says so (which path, how much is free)."""

from __future__ import annotations

import os
from pathlib import Path


def free_space(path: str | Path) -> dict[str, int]:
    """``free_bytes`` (what an unprivileged writer may still use) and ``total_bytes`` of the
    filesystem holding ``path`` (or its nearest existing parent); empty when unknown."""
    where = os.path.abspath(path)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        st = os.statvfs(where)
    except OSError:
        return {}
    return {"free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize}
