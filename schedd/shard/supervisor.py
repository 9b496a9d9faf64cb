"""A node of a cluster of several shards: one process per shard, started, watched and stopped
by this one, which also serves the node's API (:class:`schedd.shard.frontdoor.FrontDoor`).

- Each shard runs ``python -m schedd.shard.main`` with the node's own arguments, in a session
  of its own (a terminal's Ctrl-C reaches only the supervisor, which stops them in order), and
  dies with the supervisor (a node killed is a node crashed, all its shards at once).
- A shard that exits while the node runs is started again, after 0.5 s, doubling to 10 s while
  it keeps failing within a minute; one that exits with status 2 (its config, its data, or
  the node removed from the cluster) stops the node with that status.
- systemd hears READY=1 once every shard answers its ``/healthz``; the watchdog is fed while
  they do.
- SIGTERM (or Ctrl-C): every shard is told to stop at once (each hands its leadership over,
  as a node does), then the front door closes.  SIGHUP is passed on to every shard (tokens,
  log level) and reloads this process's log level.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable

from aiohttp import web

from schedd.aio import first_set
from schedd.config import LISTEN_BACKLOG, Config, server_ssl_context
from schedd.logs import log_event
from schedd.notify import Notifier
from schedd.shard.frontdoor import FrontDoor
from schedd.shard.layout import api_socket, make_socket_dir

log = logging.getLogger(__name__)

RESTART_FIRST = 0.5
RESTART_MAX = 10.0
STABLE_AFTER = 60.0  # a shard up this long starts its restart delays over
FATAL = 2  # a shard's exit status that stops the node
#: a shard's exit status once the node was removed from that shard's group: the node stops
#: (with FATAL, as a node of one shard does) once it is removed from every shard
REMOVED = 3
REMOVED_GRACE_S = 1.0  # the answers of the removal that are on their way go out first
#: what systemd gave the supervisor to speak to it: the shards say nothing to systemd
_SUPERVISOR_ONLY = frozenset({"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"})


class Supervisor:
    def __init__(self, cfg: Config, argv: list[str]) -> None:
        self.cfg = cfg
        self.argv = argv
        self.shards = cfg.cluster.shards
        self.socket_dir = make_socket_dir(cfg.data_path, os.getpid())
        self.sockets = [api_socket(self.socket_dir, k) for k in range(self.shards)]
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.front = FrontDoor(cfg, self.sockets)
        self.stopping = False
        self.failure: int | None = None
        self.failed = asyncio.Event()
        self.removed: set[int] = set()  # the shards that exited REMOVED
        self._watchers: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None

    async def _spawn(self, shard: int) -> asyncio.subprocess.Process:
        args = [
            sys.executable,
            "-m",
            "schedd.shard.main",
            "--shard",
            str(shard),
            "--supervisor",
            str(os.getpid()),
            "--sockets",
            str(self.socket_dir),
            "--",
            *self.argv,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _SUPERVISOR_ONLY}
        proc = await asyncio.create_subprocess_exec(*args, start_new_session=True, env=env)
        self.procs[shard] = proc
        log_event(log, "shard.started", shard=shard, pid=proc.pid)
        return proc

    async def _watch(self, shard: int) -> None:
        delay = RESTART_FIRST
        while True:
            started = time.monotonic()
            proc = self.procs[shard]
            code = await proc.wait()
            if self.stopping:
                return
            if code == REMOVED:
                self.removed.add(shard)
                log_event(log, "shard.removed", level=logging.WARNING, shard=shard)
                if len(self.removed) == self.shards:
                    await asyncio.sleep(REMOVED_GRACE_S)
                    self.failure = FATAL
                    self.failed.set()
                return
            if code == FATAL:
                log_event(log, "shard.failed", level=logging.ERROR, shard=shard, status=code)
                self.failure = FATAL
                self.failed.set()
                return
            if time.monotonic() - started > STABLE_AFTER:
                delay = RESTART_FIRST
            log_event(
                log,
                "shard.exited",
                level=logging.ERROR,
                shard=shard,
                status=code,
                restart_in_s=delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX)
            if self.stopping:
                return
            await self._spawn(shard)

    async def start(self) -> None:
        for shard in range(self.shards):
            await self._spawn(shard)
        self._watchers = [asyncio.create_task(self._watch(k)) for k in range(self.shards)]
        await self.front.start()
        self._runner = web.AppRunner(self.front.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        host, port = self.cfg.http.listen.rsplit(":", 1)
        site = web.TCPSite(
            self._runner,
            host.strip("[]"),
            int(port),
            ssl_context=server_ssl_context(self.cfg),
            reuse_address=True,
            backlog=LISTEN_BACKLOG,
        )
        await site.start()

    def signal_shards(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    async def stop(self) -> None:
        self.stopping = True
        self.signal_shards(signal.SIGTERM)
        grace = self.cfg.scheduler.drain_time_ms / 1000 + 10
        waits = [p.wait() for p in self.procs.values() if p.returncode is None]
        if waits:
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(w) for w in waits], timeout=grace
            )
            if pending:
                self.signal_shards(signal.SIGKILL)
                await asyncio.wait(pending, timeout=5)
        for task in self._watchers:
            task.cancel()
        # the front door first (its shards are gone): it tells the workers connected here to
        # go to another node, whose websockets would otherwise hold the server's cleanup until
        # its timeout (30 s)
        await self.front.close()
        if self._runner is not None:
            await self._runner.cleanup()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


async def serve_sharded(cfg: Config, argv: list[str], reload: Callable[[], None]) -> int:
    """Run the node of ``cfg`` (started with the arguments ``argv``) until SIGTERM; ``reload``:
    what SIGHUP reloads in this process (the log level)."""
    notifier = Notifier()
    sup = Supervisor(cfg, argv)
    await sup.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def hup() -> None:
        sup.signal_shards(signal.SIGHUP)
        reload()

    loop.add_signal_handler(signal.SIGHUP, hup)

    async def ready_then_watchdog() -> None:
        # polled: the shards are other processes
        while not await sup.front.healthy():  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        notifier.ready(f"node {cfg.node.id} serving {cfg.advertise_url()} ({sup.shards} shards)")
        log_event(
            log,
            "node.started",
            node_id=cfg.node.id,
            http=cfg.advertise_url(),
            shards=sup.shards,
            pids=[p.pid for p in sup.procs.values()],
        )
        while notifier.watchdog_s is not None:
            if await sup.front.healthy():
                notifier.send("WATCHDOG=1")
            await asyncio.sleep(notifier.watchdog_s / 2)

    readiness = asyncio.create_task(ready_then_watchdog())
    await first_set(stop, sup.failed)
    readiness.cancel()
    log_event(log, "node.stopping", node_id=cfg.node.id)
    notifier.stopping()
    await sup.stop()
    log_event(log, "node.stopped", node_id=cfg.node.id)
    return sup.failure or 0
