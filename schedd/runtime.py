"""The one place that wires schedd together: config → Raft node → leader → HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3

from aiohttp import web

from schedd import auth, clock, preflight
from schedd.aio import wait_event, within
from schedd.api.app import make_app
from schedd.api.cluster import LeaderProxy
from schedd.api.ports import Ports
from schedd.config import (
    LISTEN_BACKLOG,
    Config,
    peer_ssl_context,
    read_raft_secret,
    server_ssl_context,
)
from schedd.core.balance import hand_to
from schedd.core.fairness import TokenBucket
from schedd.core.members import VOTER, Membership
from schedd.errors import ConfigError, SchedError
from schedd.gcpolicy import GcPolicy
from schedd.leader.core import Settings as LeaderSettings
from schedd.leader.leader import Leader
from schedd.leader.membership import MembershipService, join_cluster
from schedd.logs import log_event
from schedd.metrics import Metrics
from schedd.raft.node import Hooks, RaftNode, RaftSettings
from schedd.raft.reach import Reachability, tcp_error
from schedd.storage.reader import Reader
from schedd.storage.snapshots import ImageSource, read_meta

log = logging.getLogger(__name__)


#: how often a shard's leader looks whether another node should lead it, how long that node
#: must have been ready to, and how long a hand-over for balance may take (seconds)
BALANCE_PERIOD = 1.0
BALANCE_SETTLE = 5.0
BALANCE_HAND_OVER = 2.0


def leader_settings(cfg: Config, shard: int = 0) -> LeaderSettings:
    """What the leader of ``shard`` is configured with, from the node's config (in ms, as it
    is)."""
    return LeaderSettings(
        tick_ms=cfg.scheduler.tick_ms,
        caps=dict(cfg.limits.concurrency),
        ahead_ms=cfg.scheduler.dispatch_ahead_ms,
        heartbeat_interval_ms=cfg.scheduler.heartbeat_interval_ms,
        hot_window_ms=cfg.scheduler.hot_window_ms,
        retention_ms=cfg.history.retention_ms,
        keep_per_job=cfg.history.max_runs_per_job,
        shards=cfg.cluster.shards,
        shard=shard,
    )


class Runtime:
    """One node of one Raft group: the whole node of a cluster of one shard, or one shard's
    process of a node (``shard``, its config from ``schedd.shard.layout.shard_config``),
    whose API then listens on the Unix socket ``api_socket`` for the node's front door."""

    def __init__(self, config: Config, shard: int = 0, api_socket: str | None = None) -> None:
        self.config = config
        self.shard = shard
        self._api_socket = api_socket
        self.tokens = auth.load_tokens(config.tokens_path)
        limits = config.limits
        self.rate_limits = {
            ns: TokenBucket(rate, limits.submit_burst) for ns, rate in config.node_submit_rates()
        }
        self.leader: Leader | None = None
        self._leader_task: asyncio.Task[None] | None = None
        self._leader_term = -1  # the Raft term the running leader task was started in
        self._watch_task: asyncio.Task[None] | None = None
        self._reach_task: asyncio.Task[None] | None = None
        self._balance_task: asyncio.Task[None] | None = None
        self._promote_task: asyncio.Task[None] | None = None
        self.members: MembershipService  # created in start(), with the node
        self._gc_task: asyncio.Task[None] | None = None
        self.gc: GcPolicy | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._role_changed = asyncio.Event()
        self._stopping = False
        self._background: set[asyncio.Task[None]] = set()  # kept referenced until done
        #: set when this node cannot go on as configured; :attr:`failure` says why
        self.failed = asyncio.Event()
        self.failure: str | None = None
        self.draining = False
        self.hooks = Hooks()
        self.metrics = Metrics()
        self.sockets: set[web.WebSocketResponse] = set()  # open worker websockets
        r = config.raft
        settings = RaftSettings(
            self_addr=r.listen,
            peers=tuple(r.peers),
            data_dir=config.data_path / "raft",
            password=read_raft_secret(config),
            append_entries_period_ms=r.append_entries_period_ms,
            auto_tick_period_ms=r.auto_tick_period_ms,
            raft_min_timeout_ms=r.raft_min_timeout_ms,
            raft_max_timeout_ms=r.raft_max_timeout_ms,
            leader_fallback_timeout_ms=r.leader_fallback_timeout_ms,
            log_compaction_min_entries=r.log_compaction_min_entries,
            log_compaction_min_time_ms=r.log_compaction_min_time_ms,
            hot_window_ms=config.scheduler.hot_window_ms,
            events_buffer=config.http.events_buffer,
            journal_dir=config.journal_path,
            snapshot_rate=r.snapshot_rate,
            log_keep_max=r.log_keep_max,
            loop_ticks=r.ticks == "loop",
            node_id=config.node.id,
            http_url=config.advertise_url(),
            peer_http=tuple(config.peer_http_map().items()),
            shards=config.cluster.shards,
            shard=shard,
        )
        self._settings = settings
        # https when http.tls_cert/tls_key are set (a ConfigError naming the key if unusable);
        # calls to other nodes' https API trust http.tls_ca, else the system's trusted CAs
        self._tls = server_ssl_context(config)
        self.proxy = LeaderProxy(
            config,
            self.leader_url,
            peer_ssl_context(config) or True,
            shard if config.cluster.shards > 1 else None,
        )
        self.node: RaftNode  # created in start(), on the loop's (main) thread
        self.reader: Reader  # the API's read connections to the state database (start())

    def ports(self) -> Ports:
        """What the API is given of this node (``schedd/api/ports.py``)."""
        return Ports(
            config=self.config,
            raft=self.node,
            node=self,
            reader=self.reader,
            tokens=self,  # authenticate(): the tokens as they are now (reloaded on SIGHUP)
            rate_limits=self.rate_limits,
            metrics=self.metrics,
            sockets=self.sockets,
            proxy=self.proxy,
            events=self.node.events,
            images=self,  # open_image(): GET /snapshot
            members=self.members,
            shard=self.shard,
            raft_secret=self._settings.password,
        )

    def authenticate(self, header: str | None) -> auth.Token:
        return self.tokens.authenticate(header)

    def session(self, token: auth.Token, expires_s: int, read_only: bool) -> str:
        return self.tokens.session(token, expires_s, read_only)

    def open_image(self) -> ImageSource:
        """An image of the state database as committed now, paced at ``raft.snapshot_rate``
        (``schedd.api.ports.StateImages``)."""
        return ImageSource(
            self._settings.data_dir / "state.db",
            rate=self.config.raft.snapshot_rate,
            node=self.config.node.id,
        )

    # -- start / stop ------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop

        def on_reset() -> None:
            loop.call_soon_threadsafe(self._on_reset)

        def on_role(role: int) -> None:
            loop.call_soon_threadsafe(self._role_changed.set)

        def on_fatal(message: str) -> None:
            loop.call_soon_threadsafe(self._fail, message)

        self.hooks.on_reset, self.hooks.on_role = on_reset, on_role
        self.hooks.on_fatal = on_fatal
        self.hooks.on_apply_time = self.metrics.apply_time.observe
        meta = self._state_meta()
        if self.config.raft.join and "members" not in meta:
            # A new node: the cluster records it as a learner, and it starts as one.  Until its
            # state records a membership it asks again at each start (a restart that left an
            # empty state behind must never start it alone, as a one-node cluster).
            joined = await self._join(holds_data=int(meta.get("applied_index", 0) or 0) > 0)
            self._settings = dataclasses.replace(self._settings, joined=joined)
        self.node = RaftNode(self._settings, self.hooks)
        self.members = MembershipService(
            self.node,
            self.config.node.id,
            self._settings.password,
            hand_over=lambda: self._hand_over(self.config.scheduler.drain_time_ms / 2000),
        )
        self._promote_task = asyncio.create_task(self.members.promote_when_ready())
        if self.node.journal is not None:  # observed on the Raft tick thread (thread-safe)
            self.node.journal.on_sync = self.metrics.journal_sync.observe
        self.node.attach(loop)
        self.node.start()  # its ticks (raft.ticks), with every hook above in place
        self.reader = Reader(self._settings.data_dir / "state.db")
        await self.reader.open()
        self.metrics.attach(self.node, lambda: self.leader)
        n = self.config.node
        self.gc = GcPolicy(
            n.gc_freeze_interval_ms / 1000,
            n.gc_thaw_interval_ms / 1000,
            observe=self.metrics.observe_gc,
        )
        self.gc.install()
        self._gc_task = asyncio.create_task(self.gc.run(lambda: self.node.is_leader))
        self._watch_task = asyncio.create_task(self._watch_role())
        self._reach_task = asyncio.create_task(self._watch_reach())
        if self.config.cluster.shards > 1:
            self._balance_task = asyncio.create_task(self._balance())
        # the membership this node goes by (the log's once recorded), not raft.peers
        if (warning := preflight.size_warning(len(self.node.members.voters))) is not None:
            log_event(log, "cluster.size_warning", level=logging.WARNING, warning=warning)
        app = make_app(self.ports())
        # On stop, handlers get at most half the drain time (open worker sockets are closed
        # first, with a reconnect hint).
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.config.scheduler.drain_time_ms / 2000,
        )
        await self._runner.setup()
        site: web.BaseSite
        if self._api_socket is not None:  # a shard's: the front door holds the TLS
            site = web.UnixSite(self._runner, self._api_socket, backlog=LISTEN_BACKLOG)
        else:
            host, port = self.config.http.listen.rsplit(":", 1)
            site = web.TCPSite(
                self._runner,
                host.strip("[]"),
                int(port),
                ssl_context=self._tls,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,
            )
        await site.start()
        shard = {"shard": self.shard} if self.config.cluster.shards > 1 else {}
        log_event(
            log,
            "node.started",
            node_id=self.config.node.id,
            http=self.config.advertise_url(),
            raft=self.config.raft.listen,
            peers=list(self.config.raft.peers),
            **shard,
        )

    def _state_meta(self) -> dict[str, str]:
        """The meta table of this node's state database ({} when there is none yet)."""
        try:
            return read_meta(self._settings.data_dir / "state.db")
        except sqlite3.Error:
            return {}  # not readable: the node's own start says what is wrong with it

    async def _join(self, holds_data: bool) -> Membership:
        cfg = self.config
        log_event(
            log,
            "cluster.joining",
            node_id=cfg.node.id,
            raft=cfg.raft.listen,
            join=list(cfg.raft.join),
        )
        try:
            joined = await join_cluster(
                cfg.raft.join,
                cfg.raft.listen,
                cfg.node.id,
                cfg.advertise_url(),
                self._settings.password,
                peer_ssl_context(cfg) or True,
                # (each shard's group has an id of its own: the one configured is shard 0's)
                cluster=cfg.raft.cluster_id if self.shard == 0 else "",
                data=holds_data,
                shard=self.shard if cfg.cluster.shards > 1 else None,
            )
        except SchedError as exc:
            raise ConfigError([f"raft.join: {exc.message}"]) from None
        log_event(
            log,
            "cluster.joined",
            node_id=cfg.node.id,
            index=joined.index,
            voters=[m.raft for m in joined.voters],
        )
        return joined

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            log_event(
                log, "node.failed", level=logging.ERROR, node_id=self.config.node.id, reason=message
            )
        self.failed.set()

    async def stop(self) -> None:
        """Graceful stop: stop taking work, hand leadership to another node when leading
        (workers are told to reconnect), then close the API and Raft."""
        self._stopping = True
        self.draining = True
        self.node.events.close()  # event streams end now, not at the API's shutdown timeout
        await self._hand_over(self.config.scheduler.drain_time_ms / 2000)
        if self._promote_task is not None:
            self._promote_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._promote_task
        for task in (self._reach_task, self._balance_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self._stop_leader()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        if self.gc is not None:
            self.gc.uninstall()
        for ws in list(self.sockets):
            with contextlib.suppress(Exception):
                await within(ws.close(code=1001, message=b"node stopping"), 1.0)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.proxy.close()
        await self.reader.close()
        # closing waits for the last tick and the journal's final sync: off the loop
        await asyncio.to_thread(self.node.close)
        log_event(log, "node.stopped", node_id=self.config.node.id)

    async def _hand_over(self, timeout: float, to: str | None = None, stay: bool = False) -> None:
        """Hand the leadership over (the node stops, or is being removed: it stays "handing
        over", so that if it is elected again it hands over again at once); ``to``: to that
        voter; ``stay``: the node goes on as a follower (a hand-over for balance), taking
        commands again once the leadership moved."""
        if not self.node.is_leader or len(self.node.members.voters) < 2:
            return
        await self._stop_leader()  # workers get a redirect hint and reconnect elsewhere
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.node.transfer_leadership(to)  # retried on every Raft tick until it goes
        while self.node.is_leader and loop.time() < deadline:
            await wait_event(self._role_changed, 0.3)
            self._role_changed.clear()
        if self.node.is_leader and not self._stopping:
            self.node.stop_handing_over()  # it goes on: it leads again (_watch_role)
            self._role_changed.set()
        elif stay and not self._stopping:
            self.node.stop_handing_over()  # a follower now, as any other
        log_event(
            log,
            "leader.handed_over" if not self.node.is_leader else "leader.handover_failed",
            node_id=self.config.node.id,
            term=self.node.term,
        )

    async def _balance(self) -> None:
        """A cluster of several shards: while this node leads its shard and a voter that comes
        before it in the shard's preference (schedd.core.balance) has been ready to take over
        for :data:`BALANCE_SETTLE` seconds, hand the shard to it - so that each node leads its
        share of the shards, and a failover is undone once the node is back."""
        ready_since: dict[str, float] = {}
        while not self._stopping:
            await asyncio.sleep(BALANCE_PERIOD)  # a period, not a wait for an event
            if not self.node.is_leader or self.leader is None or not self.leader.ready.is_set():
                ready_since.clear()
                continue
            now = clock.mono()
            st = self.node.raft_status
            for peer in st.peers:
                caught_up = peer.match_index is not None and peer.match_index >= st.commit_index
                if peer.connected and peer.role == VOTER and caught_up:
                    ready_since.setdefault(peer.addr, now)
                else:
                    ready_since.pop(peer.addr, None)
            settled = {a for a, since in ready_since.items() if now - since >= BALANCE_SETTLE}
            voters = [m.raft for m in self.node.members.voters]
            target = hand_to(self.config.raft.listen, voters, self.shard, settled.__contains__)
            if target is None or self._stopping:
                continue
            log_event(
                log, "leader.balancing", node_id=self.config.node.id, term=self.node.term, to=target
            )
            await self._hand_over(BALANCE_HAND_OVER, to=target, stay=True)
            ready_since.clear()

    async def _watch_reach(self) -> None:
        """Log, every few seconds while it lasts, a peer this node cannot reach and a cluster
        without a leader (schedd.raft.reach)."""
        reach = Reachability()
        while not self._stopping:
            await asyncio.sleep(reach.period)  # a period, not a wait for an event
            try:
                found = reach.look(self.node.raft_status, clock.mono())
            except Exception:  # a report must never stop the node's other work
                log.exception("looking at the peers failed")
                continue
            for event, fields in found:
                if event == "raft.peer_unreachable":
                    fields["error"] = await tcp_error(fields["peer"])
                level = (
                    logging.INFO
                    if event in ("raft.peer_reachable", "cluster.leader_known")
                    else logging.WARNING
                )
                log_event(log, event, level=level, node_id=self.config.node.id, **fields)

    # -- leadership --------------------------------------------------------------------------
    async def _watch_role(self) -> None:
        while not self._stopping:
            self._role_changed.clear()
            leading = self.node.is_leader
            if leading and self._leader_task is not None and self.node.term != self._leader_term:
                # Lost and won again between two looks (leader -> follower -> leader): the
                # running leader's claim belongs to the old term, so start over with a new one.
                log_event(
                    log,
                    "leader.lost",
                    node_id=self.config.node.id,
                    term=self._leader_term,
                    reelected_in=self.node.term,
                )
                await self._stop_leader()
            if (
                leading
                and self._leader_task is None
                and not self._stopping
                and not self.node.handing_over
            ):
                self._start_leader()
            elif not leading and self._leader_task is not None:
                log_event(log, "leader.lost", node_id=self.config.node.id, term=self.node.term)
                await self._stop_leader()
            await wait_event(self._role_changed, 0.05)

    def _start_leader(self) -> None:
        cfg = self.config
        settings = leader_settings(cfg, self.shard)
        leader = Leader(
            self.node,
            cfg.node.id,
            cfg.advertise_url(),
            settings,
            on_deposed=self._deposed,
            metrics=self.metrics,
        )
        self.leader = leader
        self._leader_term = self.node.term
        log_event(log, "leader.elected", node_id=self.config.node.id, term=self._leader_term)
        self._leader_task = asyncio.create_task(leader.run())
        self._leader_task.add_done_callback(self._leader_done)

    def _leader_done(self, task: asyncio.Task[None]) -> None:
        if task is not self._leader_task:
            return
        if not task.cancelled() and task.exception() is not None:
            log_event(log, "leader.crashed", level=logging.ERROR, error=repr(task.exception()))
        self._leader_task = None
        self.leader = None
        self._role_changed.set()

    def _deposed(self) -> None:
        task = self._leader_task
        if task is not None:
            task.cancel()

    async def _stop_leader(self) -> None:
        task = self._leader_task
        self._leader_task = None
        self.leader = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _on_reset(self) -> None:
        # A snapshot replaced the state: a leader (if any) must rebuild from scratch, and the
        # API's readers read the new database file.
        self._deposed()
        task = asyncio.get_running_loop().create_task(self.reader.reopen())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_leader_ready(self, timeout: float) -> Leader | None:
        """The active leader object if this node leads (waiting for its rebuild), else None."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            leader = self.leader
            if leader is None and not self.node.is_leader:
                return None
            if leader is not None and leader.ready.is_set():
                return leader
            await asyncio.sleep(0.02)
        return None

    def leader_url(self) -> str | None:
        """The current leader's HTTP URL, when known."""
        addr = self.node.leader_addr
        if addr is None:
            return None
        with self.node.read() as st:
            if st.leader_term == self.node.term and st.leader_http:
                return st.leader_http
        member = self.node.members.find(addr)
        if member is not None and member.http:
            return member.http
        return self.config.raft_http_map().get(addr)
