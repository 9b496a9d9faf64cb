"""Prometheus metrics (``prometheus_client``; the exposition format is never hand-written).

Each node has its own registry.  Two kinds of metric:

* observed where things happen: API request latency, scheduling lag (scheduled time → lease,
  on the leader; also kept by queue and priority for the last hour, and one by one for the
  last minutes), leases lost, the Raft journal's syncs;
* collected at scrape time from the replicated state and the Raft node: runs by state, skipped
  runs by reason, attempts by outcome, dead-letter depth, queue depth, workers and leases in
  flight (leader only), Raft role, term, commit and applied index, each follower's lag, stalled
  followers and their recoveries.
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from schedd.core.state import Counted, counts_of
from schedd.raft.gaps import GAP_BUCKETS, GapView
from schedd.raft.node import ROLES

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Mapping, Sized

    from schedd.raft.node import RaftNode, RaftStatus


class QueueLanes(Protocol):
    def depth(self) -> Mapping[tuple[str, Any], int]:
        """Queued runs per (namespace, priority)."""


class LeaderGauges(Protocol):
    """What the metrics read of the leader (``schedd.leader.leader.Leader``)."""

    @property
    def ready(self) -> asyncio.Event: ...

    @property
    def queues(self) -> Mapping[str, QueueLanes]: ...

    @property
    def workers(self) -> Sized: ...

    @property
    def leases(self) -> Sized: ...

    @property
    def wheel(self) -> Sized: ...


LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
FIRE_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1,
    1.5,
    2,
    2.5,
    5,
    10,
    30,
    60,
    300,
)
APPLY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
GC_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4)
#: a disk sync: under a millisecond on a quiet SSD, seconds on a disk that is flushing a
#: large write; 0.01 is a bound, so a p99 against the 10 ms alert is read off exactly
FSYNC_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
)


#: the scheduling-lag window keeps its counts per slot of this many seconds, for this long
LAG_SLOT_S = 10.0
LAG_KEEP_S = 3600.0
#: the recent lag samples keep each observation for this long, the newest this many per lag
SAMPLES_KEEP_S = 900.0
SAMPLES_CAP = 5000

#: one lag sample as the API gives it: [due wall ms, lag seconds, queue, priority]
LagSample = tuple[int, float, str, str]


def quantile(q: float, counts: Sequence[int], bounds: Sequence[float]) -> float | None:
    """The ``q`` quantile of the observations counted in buckets with upper ``bounds`` (the
    last count: above every bound), interpolated in its bucket as Prometheus's
    ``histogram_quantile`` does (one beyond the last bound is that bound); None for none."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i == len(bounds):
                return bounds[-1]
            low = 0.0 if i == 0 else bounds[i - 1]
            return low + (bounds[i] - low) * ((rank - seen) / count)
        seen += count
    return bounds[-1]  # pragma: no cover - the loop ends on the last non-empty bucket


class LagWindow:
    """The observations of a lag histogram over the last hour, counted in the histogram's own
    buckets per ``LAG_SLOT_S`` slot and per (queue, priority): what a Prometheus histogram, which
    only ever grows, cannot say (its quantiles over the last minutes, split by queue and
    priority), kept next to it and fed with the same values (``Metrics.observe_*``)."""

    def __init__(self, bounds: Sequence[float], keep_s: float = LAG_KEEP_S) -> None:
        self.bounds = tuple(bounds)
        self._keep = int(keep_s // LAG_SLOT_S)
        self._slots: deque[tuple[int, dict[tuple[str, str], list[int]]]] = deque()

    def observe(self, seconds: float, queue: str, priority: str, now_mono: float) -> None:
        slot = int(now_mono // LAG_SLOT_S)
        slots = self._slots
        if not slots or slots[-1][0] != slot:
            slots.append((slot, {}))
            while slots[0][0] <= slot - self._keep:
                slots.popleft()
        counts = slots[-1][1].get((queue, priority))
        if counts is None:
            counts = slots[-1][1][(queue, priority)] = [0] * (len(self.bounds) + 1)
        counts[bisect_left(self.bounds, seconds)] += 1

    def counts(self, window_s: float, now_mono: float) -> dict[tuple[str, str], list[int]]:
        """Bucket counts per (queue, priority) of the slots within the last ``window_s``."""
        first = int(now_mono // LAG_SLOT_S) - int(window_s // LAG_SLOT_S) + 1
        out: dict[tuple[str, str], list[int]] = {}
        for slot, by_key in self._slots:
            if slot < first:
                continue
            for key, counts in by_key.items():
                total = out.setdefault(key, [0] * len(counts))
                for i, n in enumerate(counts):
                    total[i] += n
        return out


class LagSamples:
    """The recent observations of a lag one by one (the dashboard draws each run as a dot):
    kept for ``keep_s`` at most, the newest ``cap`` of them, next to its ``LagWindow``.  Times
    are the caller's monotonic clock; each sample keeps the run's due time (wall clock ms) when
    the caller gives it, else it is read back as the observation's time less its lag."""

    def __init__(self, keep_s: float = SAMPLES_KEEP_S, cap: int = SAMPLES_CAP) -> None:
        self.keep_s = keep_s
        self._ring: deque[tuple[float, float, str, str, int | None]] = deque(maxlen=cap)

    def observe(
        self, seconds: float, queue: str, priority: str, now_mono: float, due_ms: int | None = None
    ) -> None:
        ring = self._ring
        ring.append((now_mono, seconds, queue, priority, due_ms))
        while ring[0][0] < now_mono - self.keep_s:
            ring.popleft()

    def recent(self, window_s: float, now_mono: float, now_wall_ms: int) -> list[LagSample]:
        """The samples observed within the last ``window_s`` (and what it keeps), oldest first,
        each with its due time (read back on the wall clock of ``now_wall_ms`` when it was not
        given)."""
        since = now_mono - min(window_s, self.keep_s)
        return [
            (
                round(now_wall_ms - (now_mono - at + seconds) * 1000) if due is None else due,
                round(seconds, 4),
                q,
                p,
            )
            for at, seconds, q, p, due in self._ring
            if at >= since
        ]

    def __len__(self) -> int:
        return len(self._ring)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.api_latency = Histogram(
            "schedd_api_request_duration_seconds",
            "API request latency by route and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.lease_lag = Histogram(
            "schedd_lease_lag_seconds",
            "Scheduling lag: from a run's scheduled (or retry) time to its lease, on the leader.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self.fire_lag = Histogram(
            "schedd_fire_lag_seconds",
            "From a run's due time to the commit of its fire, on the leader (a fire committed "
            "ahead of the due time, see scheduler.dispatch_ahead, counts as 0).",
            buckets=FIRE_BUCKETS,
            registry=self.registry,
        )
        #: the same observations as lease_lag and fire_lag, by slot and (queue, priority)
        self.lease_window = LagWindow(LAG_BUCKETS)
        self.fire_window = LagWindow(FIRE_BUCKETS)
        #: the same observations again, one by one, for the last minutes
        self.lease_samples = LagSamples()
        self.fire_samples = LagSamples()
        self.leases_lost = Counter(
            "schedd_leases_lost_total",
            "Leases ended by the leader: heartbeats stopped or the run timed out.",
            ["outcome"],
            registry=self.registry,
        )
        self.gc_pause = Histogram(
            "schedd_gc_pause_seconds",
            "Garbage collection pauses of this process by generation "
            "(see node.gc_freeze_interval).",
            ["generation"],
            buckets=GC_BUCKETS,
            registry=self.registry,
        )
        self.gc_collected = Counter(
            "schedd_gc_collected_objects_total",
            "Unreachable objects found by the garbage collector, by generation.",
            ["generation"],
            registry=self.registry,
        )
        self.apply_time = Histogram(
            "schedd_apply_duration_seconds",
            "Time to apply one Raft entry (a batch of commands) "
            "into the state database, in one transaction.",
            buckets=APPLY_BUCKETS,
            registry=self.registry,
        )
        self.journal_sync = Histogram(
            "schedd_raft_journal_fsync_seconds",
            "Time of each fdatasync of this node's Raft journal (raft.journal_dir): every "
            "acknowledgement and every commit waits for one.",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.purged = Counter(
            "schedd_history_purged_total",
            "Finished runs and jobs forgotten by history retention "
            "(counted by the leader that purged them).",
            ["kind"],
            registry=self.registry,
        )
        self.event_streams = Gauge(
            "schedd_event_streams",
            "Clients following GET /api/v1/events on this node.",
            registry=self.registry,
        )
        self.event_resets = Counter(
            "schedd_event_resets",
            "Event streams told to read their pages again (reset): the client came back from "
            "further than this node keeps (http.events_buffer), or read too slowly.",
            registry=self.registry,
        )
        self.results = Counter(
            "schedd_worker_results_total",
            "Results sent by workers, by whether they were accepted (a stale fence is refused).",
            ["accepted"],
            registry=self.registry,
        )

    def observe_lease_lag(
        self, seconds: float, queue: str, priority: str, now_mono: float, due_ms: int | None = None
    ) -> None:
        self.lease_lag.observe(seconds)
        self.lease_window.observe(seconds, queue, priority, now_mono)
        self.lease_samples.observe(seconds, queue, priority, now_mono, due_ms)

    def observe_fire_lag(
        self, seconds: float, queue: str, priority: str, now_mono: float, due_ms: int | None = None
    ) -> None:
        self.fire_lag.observe(seconds)
        self.fire_window.observe(seconds, queue, priority, now_mono)
        self.fire_samples.observe(seconds, queue, priority, now_mono, due_ms)

    def observe_gc(self, generation: int, seconds: float, collected: int) -> None:
        gen = str(generation)
        self.gc_pause.labels(gen).observe(seconds)
        if collected:
            self.gc_collected.labels(gen).inc(collected)

    def attach(self, node: RaftNode, leader: Callable[[], LeaderGauges | None]) -> None:
        """Export the state of ``node``, and of the leader ``leader()`` returns while this
        node leads."""
        self.registry.register(_StateCollector(node, leader))

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


#: (metric, help, label, key of RaftNode.elections())
_ELECTION_COUNTERS: Final = (
    (
        "schedd_raft_elections_started",
        "Raft elections this node started, by why it could: prevote_won (a majority said it "
        "would vote for it), transfer (a leader handed over), single_node.",
        "cause",
        "started",
    ),
    (
        "schedd_raft_prevote_rounds",
        "Pre-vote rounds this node ran, by outcome (won: an election followed; lost; yielded: it "
        "granted a peer's round that outranks its own, running at the same time).",
        "outcome",
        "rounds",
    ),
    (
        "schedd_raft_prevotes_refused",
        "Pre-votes this node refused, by reason: leader, leader_alive (it heard from its "
        "leader lately), stale_term, log_behind, abstaining, campaigning (its own round, running at "
        "the same time, outranks the asker's).",
        "reason",
        "refused",
    ),
    (
        "schedd_raft_votes_ignored",
        "Vote requests this node ignored while it led or heard from its leader lately.",
        "reason",
        "ignored",
    ),
    (
        "schedd_raft_leader_stepdowns",
        "Times this node stopped leading, by cause: quorum_lost (no majority heard within "
        "raft.leader_fallback_timeout), higher_term, transfer.",
        "cause",
        "stepdowns",
    ),
    (
        "schedd_raft_leader_lost",
        "Times this follower lost its leader by reason: connection_closed (its election "
        "deadline is then brought forward: a leader process that dies is replaced at once).",
        "reason",
        "leader_lost",
    ),
)


def _snapshot_metrics(stats: Mapping[str, Any]) -> Iterator[Metric]:
    if stats["index"] is not None:
        yield GaugeMetricFamily(
            "schedd_raft_snapshot_index",
            "The Raft log index this node last compacted its log up to.",
            value=stats["index"],
        )
    transfers = CounterMetricFamily(
        "schedd_raft_snapshot_transfers",
        "Whole copies of the state sent to followers (by the leader) and received from the "
        "leader, by outcome: completed, restarted (the log was compacted meanwhile), dropped "
        "(the follower went away, the leader stepped down), failed; installed, failed.",
        labels=["direction", "outcome"],
    )
    for direction in ("sent", "received"):
        for outcome, n in sorted(stats[direction].items()):
            transfers.add_metric([direction, outcome], n)
    yield transfers
    sent = CounterMetricFamily(
        "schedd_raft_snapshot_transfer_bytes",
        "Bytes of whole copies of the state sent and received.",
        labels=["direction"],
    )
    sent.add_metric(["sent"], stats["bytes_sent"])
    sent.add_metric(["received"], stats["bytes_received"])
    yield sent
    yield GaugeMetricFamily(
        "schedd_raft_snapshot_sending",
        "Whole copies of the state this leader is sending now (its log is not compacted "
        "meanwhile).",
        value=stats["sending"],
    )


def _election_counters(counts: Mapping[str, Mapping[str, int]]) -> Iterator[CounterMetricFamily]:
    for metric, text, label, key in _ELECTION_COUNTERS:
        family = CounterMetricFamily(metric, text, labels=[label])
        for value, count in sorted(counts.get(key, {}).items()):
            family.add_metric([value], float(count))
        yield family


def _gap_histograms(views: Mapping[str, GapView]) -> Iterator[Metric]:
    family = HistogramMetricFamily(
        "schedd_raft_gap_seconds",
        "Intervals the Raft election timers judge by: tick (from one tick of the Raft thread "
        "to the next), leader_contact (on a follower, between two messages of its leader), "
        "follower_answer (on the leader, between two answers of a follower).",
        labels=["kind"],
    )
    longest = GaugeMetricFamily(
        "schedd_raft_gap_max_seconds",
        "The longest interval of schedd_raft_gap_seconds since this node started, by kind.",
        labels=["kind"],
    )
    for kind, view in views.items():
        cumulative, buckets = 0, []
        for bound, count in zip((*GAP_BUCKETS, math.inf), view.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(bound), float(cumulative)))
        family.add_metric([kind], buckets, view.total)
        longest.add_metric([kind], view.longest)
    yield family
    yield longest


class _StateCollector(Collector):
    def __init__(self, node: RaftNode, leader: Callable[[], LeaderGauges | None]) -> None:
        self.node = node
        self.leader = leader

    def collect(self) -> Iterator[Metric]:
        node = self.node
        status = node.raft_status
        role = status.role
        g = GaugeMetricFamily(
            "schedd_raft_role", "1 for this node's current Raft role.", labels=["role"]
        )
        for name in ROLES.values():
            g.add_metric([name], 1.0 if name == role else 0.0)
        yield g
        yield GaugeMetricFamily("schedd_raft_term", "Current Raft term.", value=node.term)
        yield GaugeMetricFamily(
            "schedd_raft_commit_index", "Raft commit index.", value=node.commit_index
        )
        yield GaugeMetricFamily(
            "schedd_raft_applied_index", "Last applied Raft index.", value=node.applied_index
        )
        yield GaugeMetricFamily(
            "schedd_raft_has_quorum",
            "1 when this node sees a quorum.",
            value=1.0 if node.has_quorum() else 0.0,
        )
        yield GaugeMetricFamily(
            "schedd_gc_frozen_objects",
            "Objects in the garbage collector's "
            "permanent generation (never scanned; see node.gc_freeze_interval).",
            value=gc.get_freeze_count(),
        )
        duration = node.last_snapshot_duration
        if duration is not None:
            yield GaugeMetricFamily(
                "schedd_raft_snapshot_duration_seconds",
                "How long this node's last log compaction took (a barrier: the state "
                "database synced and the snapshot marker written).",
                value=duration,
            )
        age = node.snapshot_age()
        if age is not None:
            yield GaugeMetricFamily(
                "schedd_raft_snapshot_age_seconds",
                "Seconds since this node last compacted its Raft log (wrote its marker).",
                value=age,
            )
        yield from _snapshot_metrics(node.snapshot_stats())
        db, wal = node.database_bytes()
        yield GaugeMetricFamily(
            "schedd_state_db_bytes",
            "Size of this node's state database file (raft/state.db).",
            value=db,
        )
        yield GaugeMetricFamily(
            "schedd_state_wal_bytes",
            "Size of the state database's write-ahead log (raft/state.db-wal).",
            value=wal,
        )
        yield from self._followers(status)
        refused = CounterMetricFamily(
            "schedd_raft_peer_refused",
            "Raft connections this node refused, by reason: "
            "wrong_secret (another raft.secret_file, or none) or not_in_peers (a node that "
            "raft.peers does not list).",
            labels=["reason"],
        )
        for reason, count in sorted(node.peer_refusals().items()):
            refused.add_metric([reason], float(count))
        yield refused
        yield from _election_counters(node.elections())
        yield from _gap_histograms(node.gap_views())
        with node.read() as st:
            counts = dict(st.counts)
            dlq = st.dlq_size()
            jobs = len(st.jobs)
        runs = GaugeMetricFamily("schedd_runs", "Runs by state.", labels=["state"])
        skipped = CounterMetricFamily(
            "schedd_runs_skipped", "Occurrences that did not run, by reason.", labels=["reason"]
        )
        attempts = CounterMetricFamily(
            "schedd_attempts", "Finished attempts by outcome.", labels=["outcome"]
        )
        for family, kind in (
            (runs, Counted.STATE),
            (skipped, Counted.SKIPPED),
            (attempts, Counted.ATTEMPT),
        ):
            for label, value in sorted(counts_of(counts, kind).items()):
                family.add_metric([label], float(value))
        yield runs
        yield skipped
        yield attempts
        yield GaugeMetricFamily(
            "schedd_dead_letter_depth", "Runs in the dead-letter queue.", value=dlq
        )
        yield GaugeMetricFamily("schedd_jobs", "Jobs known to the cluster.", value=jobs)
        yield GaugeMetricFamily(
            "schedd_state_hot_runs",
            "Runs this node keeps decoded in memory "
            "(the hot set): queued, running, or waiting for a time within "
            "scheduler.hot_window.",
            value=node.hot_set(),
        )
        leader = self.leader()
        if leader is not None and leader.ready.is_set():
            depth = GaugeMetricFamily(
                "schedd_queue_depth",
                "Runs waiting for a worker, by queue, namespace and priority (leader only).",
                labels=["queue", "namespace", "priority"],
            )
            for queue, lanes in leader.queues.items():
                for (ns, priority), n in lanes.depth().items():
                    depth.add_metric([queue, ns, str(priority)], float(n))
            yield depth
            yield GaugeMetricFamily(
                "schedd_workers_connected",
                "Workers connected to the leader.",
                value=len(leader.workers),
            )
            yield GaugeMetricFamily(
                "schedd_leases_in_flight", "Runs leased to workers.", value=len(leader.leases)
            )
            yield GaugeMetricFamily(
                "schedd_wheel_pending", "Runs waiting in the timing wheel.", value=len(leader.wheel)
            )

    def _followers(self, status: RaftStatus) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if status.role == "leader":
            lag = GaugeMetricFamily(
                "schedd_raft_follower_lag_entries",
                "Entries a follower's log is behind the leader's commit index.",
                labels=["peer"],
            )
            for peer in status.peers:
                if peer.match_index is not None:
                    lag.add_metric(
                        [peer.addr], float(max(0, status.commit_index - peer.match_index))
                    )
            yield lag
            stalled = GaugeMetricFamily(
                "schedd_raft_follower_stalled",
                "1 while a follower answers the leader but its match index has not moved for 3 s "
                "although it is behind the commit index: a stalled follower, which the leader "
                "recovers by sending it a snapshot (see docs/operations.md).",
                labels=["peer"],
            )
            for peer in status.peers:
                stalled.add_metric([peer.addr], float(peer.stalled))
            yield stalled
        recoveries = CounterMetricFamily(
            "schedd_raft_follower_stall_recoveries",
            "Stalled followers this node, as leader, recovered by compacting its log at once "
            "(the follower is sent a snapshot).",
            labels=["peer"],
        )
        for peer in status.peers:
            recoveries.add_metric([peer.addr], float(peer.stall_recoveries))
        yield recoveries
