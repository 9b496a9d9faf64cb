"""One shard's process: ``python -m schedd.shard.main --shard K --supervisor PID --sockets DIR
-- ARGS``.

ARGS are the node's own arguments (``schedd --config ...``): the process reads the node's
config as the supervisor did, and runs the node of shard K's Raft group
(:func:`schedd.shard.layout.shard_config`), its API on the supervisor's socket for it.  It dies
with its supervisor (``PR_SET_PDEATHSIG``: a killed node is a crashed node, all its shards at
once), stops on SIGTERM (handing its leadership over, as a node does), and reloads the tokens
and the log level on SIGHUP.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from schedd import aio
from schedd.aio import first_set
from schedd.cli import node
from schedd.config import Config
from schedd.errors import ConfigError
from schedd.logs import log_event, setup_logging
from schedd.shard.layout import api_socket, shard_config
from schedd.shard.supervisor import REMOVED

log = logging.getLogger("schedd.shard")

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (and now, if it already has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the call
        os.kill(os.getpid(), signal.SIGKILL)


class _ShardField(logging.Filter):
    """Every line of this process names its shard."""

    def __init__(self, shard: int) -> None:
        super().__init__()
        self.shard = shard

    def filter(self, record: logging.LogRecord) -> bool:
        fields: Any = getattr(record, "fields", None)
        record.fields = {"shard": self.shard, **(fields if isinstance(fields, dict) else {})}
        return True


async def serve_shard(cfg: Config, shard: int, socket: str, args: argparse.Namespace) -> int:
    from schedd.runtime import Runtime

    rt = Runtime(cfg, shard=shard, api_socket=socket)
    await rt.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: node.reload_node(rt, args))
    await first_set(stop, rt.failed)
    await rt.stop()
    if rt.failure is not None:
        print(f"schedd: shard {shard}: {rt.failure}", file=sys.stderr)
        return REMOVED if rt.node.removed else 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print(
            "usage: python -m schedd.shard.main --shard K --supervisor PID --sockets DIR -- ARGS",
            file=sys.stderr,
        )
        return 2
    cut = argv.index("--")
    own = argparse.ArgumentParser(prog="schedd shard")
    own.add_argument("--shard", type=int, required=True)
    own.add_argument("--supervisor", type=int, required=True)
    own.add_argument("--sockets", type=Path, required=True)
    mine = own.parse_args(argv[:cut])
    die_with_parent(mine.supervisor)
    # a Ctrl-C in a terminal is the supervisor's to handle: it stops the shards in order
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = node.parse_args(argv[cut + 1 :])
    try:
        node_cfg = node.build_config(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"schedd: shard {mine.shard}: config: {problem}", file=sys.stderr)
        return 2
    cfg = shard_config(node_cfg, mine.shard)
    handler = setup_logging(cfg.log.level, cfg.log.format)
    handler.addFilter(_ShardField(mine.shard))
    (cfg.data_path / "raft").mkdir(parents=True, exist_ok=True)
    if cfg.raft.journal_dir is not None:
        cfg.journal_path.mkdir(parents=True, exist_ok=True)
    socket = api_socket(mine.sockets, mine.shard)
    log_event(log, "shard.starting", level=logging.DEBUG, pid=os.getpid())
    return aio.run(serve_shard(cfg, mine.shard, socket, args))


if __name__ == "__main__":
    sys.exit(main())
