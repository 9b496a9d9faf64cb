"""The record a node keeps in ``node.data_dir`` of the cluster its data belongs to:
``cluster.json``, ``{"format": 1, "shards": N}``.

The number of shards is fixed when a cluster is created: every job id says its shard, and
each shard's log and state live in their own files.  A node whose config names another number
than its data was made with would route jobs to shards that do not hold them, so it refuses to
start, naming both.  The record is written the first time a node starts with the data
directory (atomically: a file that exists is whole); a data directory from before the record
holds one shard's data (the only kind there was) and is given its record then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from schedd.config import JOURNAL_FILE, STATE_FILE, Config
from schedd.storage.snapshots import atomic_write

RECORD_FILE: Final = "cluster.json"
RECORD_FORMAT: Final = 1


class RecordError(Exception):
    """The record cannot be read, or says what this node cannot use; the message says what
    to do."""


def record_path(cfg: Config) -> Path:
    return cfg.data_path / RECORD_FILE


def holds_data(cfg: Config) -> bool:
    """Whether the node has run with this data directory (its state or its journal exists)."""
    return (cfg.data_path / "raft" / STATE_FILE).exists() or (
        cfg.journal_path / JOURNAL_FILE
    ).exists()


def read_record(cfg: Config) -> int | None:
    """The shards the data directory was created with; None when it has no record."""
    path = record_path(cfg)
    expected = f'expected {{"format": {RECORD_FORMAT}, "shards": N}}'
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RecordError(f'node.data_dir: cannot read "{path}": {exc.strerror or exc}') from None
    except ValueError:
        raise RecordError(f'node.data_dir: "{path}" is not JSON; {expected}') from None
    if not isinstance(data, dict) or not isinstance(data.get("format"), int):
        raise RecordError(f'node.data_dir: "{path}" is not a cluster record; {expected}')
    if data["format"] > RECORD_FORMAT:
        raise RecordError(
            f'node.data_dir: "{path}" has format {data["format"]}, this schedd reads '
            f"{RECORD_FORMAT}: it was written by a newer schedd. Run that version (or newer)."
        )
    shards = data.get("shards")
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise RecordError(f'node.data_dir: "{path}" has no valid "shards"; {expected}')
    return shards


def write_record(cfg: Config, shards: int) -> None:
    """Write the record atomically (a temporary file renamed over it, both synced)."""
    path = record_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"format": RECORD_FORMAT, "shards": shards}).encode() + b"\n"
    atomic_write(path, body)


def mismatch(cfg: Config, recorded: int) -> str | None:
    """The refusal when the data was made with ``recorded`` shards and the config says
    otherwise; None when they agree."""
    wanted = cfg.cluster.shards
    if recorded == wanted:
        return None
    return (
        f'cluster.shards: node.data_dir "{cfg.data_path}" holds a cluster created with '
        f"shards = {recorded}; this config says shards = {wanted}. The number of shards is "
        f"fixed when a cluster is created: set [cluster] shards = {recorded}, as on every "
        "other node of the cluster (or start this node with an empty node.data_dir)"
    )


def check_record(cfg: Config) -> list[str]:
    """What is wrong between the data directory's record and the config, without writing
    anything (a data directory with data and no record was made with one shard)."""
    try:
        recorded = read_record(cfg)
    except RecordError as exc:
        return [str(exc)]
    if recorded is None:
        recorded = 1 if holds_data(cfg) else None
    problem = None if recorded is None else mismatch(cfg, recorded)
    return [] if problem is None else [problem]


def ensure_record(cfg: Config) -> list[str]:
    """:func:`check_record`, then the record written when the data directory has none."""
    problems = check_record(cfg)
    if problems or record_path(cfg).exists():
        return problems
    try:
        write_record(cfg, cfg.cluster.shards)
    except OSError as exc:
        return [f'node.data_dir: cannot write "{record_path(cfg)}": {exc.strerror or exc}']
    return []
