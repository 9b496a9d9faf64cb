"""History recording and the invariant checker of the fault-injection suite.

During a schedule, :class:`History` records every client operation (each submit, each HTTP
attempt of it, its acknowledgement with the job id) and every fault (start, heal).  Afterwards
:func:`collect` reads the full state from every node once their applied index equals the
leader's commit index, the workers' execution records and their logs are read, and
:func:`check` counts the violations of each invariant.  Every count must be 0.

Invariants (``report["invariants"]``):

* ``lost_acknowledged_jobs`` — an acknowledged job missing on some node, or present with a
  different payload than the one submitted.
* ``duplicate_job_ids`` — a job id listed twice, one operation that became two jobs (a retry with
  the same ``X-Request-Id`` after a lost reply must not create a second job), or two operations
  acknowledged with the same id.
* ``overlapping_leases`` — two attempts of one run valid at once: an attempt that is not the
  last one without an end, an attempt that ended after the next one was leased (wall-clock stamps
  of the leaders; the tolerance is the largest clock shift the schedule applied), fences not
  strictly increasing.
* ``stale_completions`` — a completion accepted with a stale fence: the succeeded attempt is not
  the last one or not the highest fence, two succeeded attempts, the stored result was produced
  by another attempt than the succeeded one (``acc.record`` returns its attempt number), or no
  worker executed the run with the succeeded attempt's fence.
* ``duplicate_fires`` — one (job, scheduled time) fired twice: a one-off job with more than one
  run, two runs of one job at the same scheduled time, a cron run whose scheduled time is not
  on the cron's whole second (schedd makes a colliding run id unique by adding milliseconds), or
  a worker that executed one fence twice.
* ``executions_without_lease`` — a worker executed a run with a fence the log never granted to
  that run (or for a run that does not exist).
* ``replica_divergence`` — nodes whose state (every job and every run, as the API shows them)
  differs from the leader's, once every applied index equals the leader's commit index.
* ``stuck_jobs`` — acknowledged one-off jobs not finished (done or cancelled) after the settle
  period with every fault healed.
* ``failover_over_bound`` — faults after which no submit was acknowledged within the bound
  (from the fault's start when it leaves a connected majority of live nodes, else from its heal).
* ``unexpected_exits`` — a node or worker process that exited by itself: anything but the
  harness's own kills and, for a node whose disk was full (``disk_full``), its fail-fast stop
  with status 70.
* ``rebuild_over_bound`` — a follower restarted with an empty data directory
  (``wipe_follower``) that had not applied the leader's commit index within
  :data:`REBUILD_BOUND_S` of its restart (the other invariants then judge it with the rest:
  it must hold every acknowledged job, and the same state as the leader).
* ``membership_divergence`` — at the end, the members disagree on the membership
  (``GET /api/v1/cluster/nodes`` on every live member: the log index it was recorded at, each
  node's Raft address and role, the removed addresses), or it is not the one the harness made
  (the nodes it removed gone, the nodes it added there), or a removed node went on running: one
  restarted with its data, or removed while it ran, that had not stopped with status 2 within
  a bound (``replace_node``, ``add_interrupted`` in tests/cluster/faults.py).
* ``stuck_learner`` — a learner still in some member's membership at the end, after a quiet
  period (:func:`read_members`): a node added that was never promoted (nor removed).

The two membership invariants are counted only when :func:`check` is given the members' views
(``members=``; the fault schedules give them, the soak does not).

With history retention (``check(retention_s=...)``, the soak), a job or run may be forgotten by
every node.  An acknowledged job missing on every node counts as forgotten, not lost, only when
a worker's last execution of it (the records' wall-clock stamps) came more than the retention
before the nodes were read - it finished after that execution, and retention counts from its
last change - and, for a recurring job, it was cancelled before that too.  An execution of a run no node has counts only when
the run was scheduled more than the retention before the read and its job is recurring (old
runs go while the job stays) or gone too.  Anything else missing is still a violation.  (Runs
trimmed by ``max_runs_per_job`` are not allowed for: the soak keeps fewer per job.)
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

INVARIANTS = (
    "lost_acknowledged_jobs",
    "duplicate_job_ids",
    "overlapping_leases",
    "stale_completions",
    "duplicate_fires",
    "executions_without_lease",
    "replica_divergence",
    "stuck_jobs",
    "failover_over_bound",
    "unexpected_exits",
    "rebuild_over_bound",
    "membership_divergence",
    "stuck_learner",
)
#: seconds from a wiped follower's restart until it must have applied the leader's commit index
REBUILD_BOUND_S = 10.0


def parse_ms(value: str | None) -> int | None:
    if value is None:
        return None
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


@dataclass
class Attempt:
    node: int
    sent: float
    done: float
    status: int | None  # HTTP status, None on a connection error or timeout
    error: str | None = None


@dataclass
class Op:
    """One job submission, retried (same X-Request-Id) until acknowledged or given up."""

    op: int
    kind: str  # oneoff | long | cron
    tag: str
    body: dict[str, Any]
    invoked: float  # seconds since the history's start (monotonic)
    completed: float | None = None
    ok: bool = False  # acknowledged (201, or 200 for a repeat)
    job_id: str | None = None
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class Fault:
    step: int
    kind: str
    target: str
    detail: str
    started: float
    healed: float | None = None
    keeps_majority: bool = True  # a connected majority of live nodes exists during the fault
    clock_shift_s: float = 0.0
    #: the node whose data directory the fault deleted (wipe_follower), and, once it is back,
    #: seconds from its restart until it had applied the leader's commit index (None: not
    #: within REBUILD_BOUND_S) and how: "snapshot" (it installed a whole copy) or "log"
    wiped: str | None = None
    rebuilt_s: float | None = None
    rebuilt_by: str | None = None
    #: the node started at a new address with raft.join (replace_node, add_interrupted), and
    #: seconds from its start until the leader listed it as a voter (None: not seen within the
    #: step's bound); for add_interrupted, whether it was still a learner (in the leader's
    #: membership) when the leader was killed
    joined: str | None = None
    promoted_s: float | None = None
    learner_at_kill: bool | None = None
    #: the node removed from the membership, and whether it then stopped by itself with status
    #: 2 (restarted once with its data: refused; or removed while it ran)
    removed: str | None = None
    refused: bool | None = None


class History:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.ops: list[Op] = []
        self.faults: list[Fault] = []
        self.notes: list[tuple[float, str]] = []
        self.exits: list[str] = []  # processes that exited by themselves, unexpectedly
        #: what went wrong with a membership change as the harness made it (a removal refused,
        #: a removed node that kept running): counted as membership_divergence
        self.membership: list[str] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, text: str) -> None:
        self.notes.append((round(self.now(), 3), text))

    def new_op(self, kind: str, body: dict[str, Any]) -> Op:
        op = Op(len(self.ops), kind, body["payload"]["tag"], body, self.now())
        self.ops.append(op)
        return op

    def fault_started(
        self,
        step: int,
        kind: str,
        target: str,
        detail: str,
        keeps_majority: bool,
        clock_shift_s: float = 0.0,
    ) -> Fault:
        f = Fault(step, kind, target, detail, self.now(), None, keeps_majority, clock_shift_s)
        self.faults.append(f)
        self.note(f"fault {step} {kind} {target} {detail}")
        return f

    def fault_healed(self, fault: Fault) -> None:
        fault.healed = self.now()
        self.note(f"heal {fault.step} {fault.kind}")


# -- reading the final state ---------------------------------------------------------------------


@dataclass
class NodeState:
    node: int
    applied_index: int  # (with several shards: shard 0's; ``positions`` has each shard's)
    jobs: dict[str, dict[str, Any]]
    runs: dict[str, list[dict[str, Any]]]
    listed: list[str]  # job ids in listing order, repeats included
    positions: tuple[int, ...] = ()  # each shard's applied index

    def checksum(self) -> str:
        h = hashlib.sha256()
        for job_id in sorted(self.jobs):
            h.update(orjson.dumps(self.jobs[job_id], option=orjson.OPT_SORT_KEYS))
            h.update(
                orjson.dumps(
                    sorted(self.runs.get(job_id, []), key=lambda r: r["id"]),
                    option=orjson.OPT_SORT_KEYS,
                )
            )
        return h.hexdigest()


async def _get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as r:
        if r.status != 200:
            raise RuntimeError(f"GET {url}: {r.status} {await r.text()}")
        return await r.json(loads=orjson.loads)


async def read_node(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], node: int
) -> NodeState:
    """Every job (all pages) and every job's runs, from one node's local state."""
    view = await _get(http, url + "/api/v1/cluster", headers)
    jobs: dict[str, dict[str, Any]] = {}
    listed: list[str] = []
    cursor: str | None = None
    while True:
        after = f"&cursor={cursor}" if cursor else ""
        page = await _get(http, f"{url}/api/v1/jobs?limit=1000{after}", headers)
        for j in page["jobs"]:
            listed.append(j["id"])
            jobs[j["id"]] = j
        cursor = page.get("next_cursor")
        if cursor is None:
            break
    sem = asyncio.Semaphore(16)
    runs: dict[str, list[dict[str, Any]]] = {}

    async def one(job_id: str) -> None:
        async with sem:
            got: list[dict[str, Any]] = []
            after: str | None = ""
            while after is not None:
                page = await _get(
                    http, f"{url}/api/v1/jobs/{job_id}/runs?limit=1000{after}", headers
                )
                got += page["runs"]
                after = f"&cursor={page['next_cursor']}" if page.get("next_cursor") else None
            runs[job_id] = got

    await asyncio.gather(*(one(j) for j in jobs))
    return NodeState(node, int(view["applied_index"]), jobs, runs, listed, positions(view))


def groups(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Each shard's view of its group as a node sees it (one shard: the view itself)."""
    shards = view.get("shards")
    return list(shards) if isinstance(shards, list) and len(shards) > 1 else [view]


def positions(view: dict[str, Any] | None) -> tuple[int, ...]:
    """The applied index of each shard a node's view shows."""
    return () if view is None else tuple(int(g["applied_index"]) for g in groups(view))


async def indexes(
    http: aiohttp.ClientSession, urls: list[str], headers: dict[str, str]
) -> list[dict[str, Any] | None]:
    async def one(url: str) -> dict[str, Any] | None:
        try:
            v: dict[str, Any] = await _get(http, url + "/api/v1/cluster", headers)
            return v
        except (aiohttp.ClientError, TimeoutError, RuntimeError):
            return None

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def converged(
    http: aiohttp.ClientSession, urls: list[str], headers: dict[str, str], timeout: float
) -> tuple[bool, list[dict[str, Any] | None]]:
    """Poll until, in each shard, one leader is known to all and every applied index equals
    its commit index."""
    deadline = time.monotonic() + timeout
    views: list[dict[str, Any] | None] = []
    while time.monotonic() < deadline:
        views = await indexes(http, urls, headers)
        if all(v is not None for v in views) and all(
            _group_converged([groups(v)[k] for v in views if v is not None])
            for k in range(len(groups(views[0]) if views[0] else []))
        ):
            return True, views
        await asyncio.sleep(0.2)
    return False, views


def _group_converged(views: list[dict[str, Any]]) -> bool:
    """One shard's group as each node sees it: one leader, and everything committed applied."""
    leaders = [v for v in views if v["role"] == "leader"]
    if len(leaders) != 1:
        return False
    commit = leaders[0]["commit_index"]
    return all(
        v["applied_index"] == commit
        and v["commit_index"] == commit
        and v.get("state_index", commit) == commit
        for v in views
    )


async def collect(
    http: aiohttp.ClientSession,
    urls: list[str],
    headers: dict[str, str],
    timeout: float = 60.0,
    nodes: list[int] | None = None,
) -> tuple[list[NodeState], dict[str, Any]]:
    """A consistent read of every node: all applied up to the leader's commit index, and that
    index unchanged from before the reads to after them.  ``nodes``: the index of each url's
    node in the cluster (the names ``n<i+1>`` the report uses), if not its position."""
    names = nodes or list(range(len(urls)))
    deadline = time.monotonic() + timeout
    info: dict[str, Any] = {"converged": False, "tries": 0}
    states: list[NodeState] = []
    while time.monotonic() < deadline:
        info["tries"] += 1
        ok, before = await converged(http, urls, headers, max(1.0, deadline - time.monotonic()))
        if not ok:
            info["views"] = before
            break
        read_ms = int(time.time() * 1000)
        states = list(
            await asyncio.gather(
                *(read_node(http, u, headers, i) for i, u in zip(names, urls, strict=True))
            )
        )
        after = await indexes(http, urls, headers)
        same = all(
            a is not None and b is not None and positions(a) == positions(b)
            for a, b in zip(before, after, strict=True)
        )
        if same and len({s.positions for s in states}) == 1:
            info["converged"] = True
            info["read_wall_ms"] = read_ms
            info["index"] = states[0].applied_index
            info["leader"] = next(i for i, v in enumerate(before) if v and v["role"] == "leader")
            return states, info
    return states, info


MEMBERS_PATH = "/api/v1/cluster/nodes"
#: how long the members' views may take to agree, with no learner left, at the end
MEMBERS_QUIET_S = 10.0


def _membership_key(view: dict[str, Any], alias: dict[str, str]) -> tuple[Any, ...]:
    """What every member must agree on: the index the membership was recorded at, each node's
    Raft address (as ``alias`` names it) and role, the removed addresses.  (Ids and URLs are
    filled in by each node from what its peers told it, and may differ while harmless.)"""
    return (
        view.get("index"),
        tuple(sorted((alias.get(n["raft"], n["raft"]), n["role"]) for n in view["nodes"])),
        tuple(sorted(alias.get(a, a) for a in view.get("removed", ()))),
    )


def _learners(view: dict[str, Any]) -> list[str]:
    return [n["raft"] for n in view["nodes"] if n["role"] != "voter"]


async def read_members(
    http: aiohttp.ClientSession,
    urls: list[str],
    headers: dict[str, str],
    alias: dict[str, str] | None = None,
    quiet_s: float = MEMBERS_QUIET_S,
) -> list[dict[str, Any] | None]:
    """Every node's ``GET /api/v1/cluster/nodes``, read again until all answer the same
    membership with no learner in it, at most ``quiet_s`` (the quiet period): the last
    answers (None for a node that did not answer)."""
    alias = alias or {}
    deadline = time.monotonic() + quiet_s

    async def one(url: str) -> dict[str, Any] | None:
        try:
            v: dict[str, Any] = await _get(http, url + MEMBERS_PATH, headers)
            return v
        except (aiohttp.ClientError, TimeoutError, RuntimeError):
            return None

    while True:
        views = list(await asyncio.gather(*(one(u) for u in urls)))
        answered = [v for v in views if v is not None]
        if (
            len(answered) == len(views)
            and len({_membership_key(v, alias) for v in answered}) == 1
            and not any(_learners(v) for v in answered)
        ) or time.monotonic() > deadline:
            return views
        await asyncio.sleep(0.2)


def membership_problems(
    views: list[dict[str, Any] | None],
    names: list[str],
    expected: list[str],
    alias: dict[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """(membership_divergence, stuck_learner) evidence from the members' views (``names``: the
    node each came from; ``expected``: the members the harness made, as ``alias`` names
    their Raft addresses)."""
    alias = alias or {}
    divergence: list[str] = []
    learners: dict[str, list[str]] = defaultdict(list)

    def show(view: dict[str, Any]) -> str:
        nodes = ", ".join(
            f"{alias.get(n['raft'], n['raft'])} {n['role']}"
            for n in sorted(view["nodes"], key=lambda n: str(n["raft"]))
        )
        return f"index {view.get('index')}: {nodes}; removed {view.get('removed', [])}"

    ref: tuple[str, dict[str, Any]] | None = None
    for name, view in zip(names, views, strict=True):
        if view is None:
            divergence.append(f"{name} did not answer GET {MEMBERS_PATH}")
            continue
        for raft in _learners(view):
            learners[alias.get(raft, raft)].append(name)
        if ref is None:
            ref = (name, view)
        elif _membership_key(view, alias) != _membership_key(ref[1], alias):
            divergence.append(f"{name} reports {show(view)}; {ref[0]} reports {show(ref[1])}")
    if ref is not None:
        have = sorted(alias.get(n["raft"], n["raft"]) for n in ref[1]["nodes"])
        if have != sorted(expected):
            divergence.append(
                f"the members are {have} ({ref[0]}: {show(ref[1])}); the harness made "
                f"{sorted(expected)}"
            )
    stuck = [
        f"{learner} still a learner after the quiet period (reported by {', '.join(who)})"
        for learner, who in sorted(learners.items())
    ]
    return divergence, stuck


def member_groups(
    members: dict[str, Any],
) -> list[tuple[str, list[dict[str, Any] | None], dict[str, str]]]:
    """Each Raft group's (label for its evidence, views, alias): the first shard's (no label),
    then every other shard's (``shard k: ``), each of which must hold the same members."""
    groups = [("", members["views"], members.get("alias") or {})]
    for k, group in sorted((members.get("shards") or {}).items()):
        groups.append((f"shard {k}: ", group["views"], group.get("alias") or {}))
    return groups


# -- worker evidence -------------------------------------------------------------------------------


def _record_lines(paths: list[Path]) -> list[tuple[Path, list[str] | None]]:
    """Each line of the workers' records, split: ``run_id fence attempt [wall_ms]`` (None for a
    malformed line: a worker killed in the middle of a write)."""
    out: list[tuple[Path, list[str] | None]] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            ok = len(parts) in (3, 4) and all(p.isdigit() for p in parts[1:])
            out.append((path, parts if ok else None))
    return out


def read_executions(paths: list[Path]) -> tuple[list[tuple[str, int, int, str]], int]:
    """(run_id, fence, attempt, worker record file) per execution; and malformed lines."""
    out: list[tuple[str, int, int, str]] = []
    bad = 0
    for path, parts in _record_lines(paths):
        if parts is None:
            bad += 1
        else:
            out.append((parts[0], int(parts[1]), int(parts[2]), path.name))
    return out, bad


def last_executions(paths: list[Path]) -> dict[str, int]:
    """Per job, the wall-clock time (ms) of its last recorded execution, from the lines that
    carry one (``SCHEDD_TEST_RECORD_TIME``)."""
    last: dict[str, int] = {}
    for _, parts in _record_lines(paths):
        if parts is not None and len(parts) == 4:
            job = parts[0].rpartition("@")[0]
            last[job] = max(last.get(job, 0), int(parts[3]))
    return last


_REFUSED = re.compile(r"worker\.result_refused run_id=(\S+) fence=(\d+)")


def read_refusals(paths: list[Path]) -> list[tuple[str, int]]:
    """Completions the server refused (stale fence), from the workers' logs."""
    out: list[tuple[str, int]] = []
    for path in paths:
        if path.exists():
            out += [(m[1], int(m[2])) for m in _REFUSED.finditer(path.read_text(errors="replace"))]
    return out


# -- the checks ------------------------------------------------------------------------------------


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)  # nearest rank
    return round(s[max(0, min(len(s), math.ceil(len(s) * p)) - 1)], 3)


def recovery_times(history: History, bound_s: float) -> list[dict[str, Any]]:
    """Per fault: seconds from its start (and from its heal) until a submit invoked at or after
    that moment was acknowledged."""
    acked = sorted((op.invoked, op.completed) for op in history.ops if op.ok and op.completed)
    out = []
    for f in history.faults:

        def first_ack(t: float) -> float | None:
            times = [done - t for inv, done in acked if inv >= t]
            return round(min(times), 3) if times else None

        from_start = first_ack(f.started)
        from_heal = first_ack(f.healed) if f.healed is not None else None
        measured = from_start if f.keeps_majority else from_heal
        out.append(
            {
                "step": f.step,
                "kind": f.kind,
                "target": f.target,
                "from_start_s": from_start,
                "from_heal_s": from_heal,
                "bound_from": "start" if f.keeps_majority else "heal",
                "within_bound": measured is not None and measured <= bound_s,
            }
        )
    return out


def slow_rebuilds(history: History, bound_s: float) -> list[str]:
    """The wiped nodes not seen caught up with the leader within ``bound_s`` of their restart."""
    return [
        f"fault {f.step} {f.kind}: {f.wiped} restarted empty at t={f.healed}s and "
        + (
            "never applied the leader's commit index"
            if f.rebuilt_s is None
            else f"applied the leader's commit index {f.rebuilt_s}s later"
        )
        + f" (bound {bound_s}s)"
        for f in history.faults
        if f.wiped is not None and (f.rebuilt_s is None or f.rebuilt_s > bound_s)
    ]


def check(
    history: History,
    states: list[NodeState],
    collect_info: dict[str, Any],
    executions: list[tuple[str, int, int, str]],
    malformed: int,
    refusals: list[tuple[str, int]],
    *,
    bound_s: float,
    cron_jobs: list[str],
    retention_s: float | None = None,
    interval_jobs: list[str] | None = None,
    executed_ms: dict[str, int] | None = None,
    cancelled_ms: dict[str, int] | None = None,
    rebuild_bound_s: float = REBUILD_BOUND_S,
    members: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Count every invariant's violations (each with its evidence) and build the report.
    ``cron_jobs`` and ``interval_jobs`` are the recurring jobs (a cron's runs must be on its
    whole seconds); ``retention_s`` and ``executed_ms`` (:func:`last_executions`) let a job or
    run that history retention forgot go (see the module's docstring), and ``cancelled_ms``
    says when the recurring jobs were cancelled (only then may one be forgotten).
    ``members``: the live members' membership views at the end (``views``, from the nodes
    ``names``), the members the harness made (``expected``) and what names each Raft address
    (``alias``), and with several shards each other shard's group the same way (``shards``:
    ``{shard: {"views", "alias"}}``); see :func:`membership_problems`."""
    v: dict[str, list[str]] = {k: [] for k in INVARIANTS}
    v["unexpected_exits"] = list(history.exits)
    stats: Counter[str] = Counter()
    recurring = set(cron_jobs) | set(interval_jobs or ())
    recurring |= {op.job_id for op in history.ops if op.kind == "cron" and op.job_id}
    forgot: Forgetting | None = None
    if retention_s is not None and "read_wall_ms" in collect_info and states:
        ref_jobs = states[collect_info.get("leader", 0)].jobs
        forgot = Forgetting(
            collect_info["read_wall_ms"] - retention_s * 1000,
            executed_ms or {},
            recurring,
            ref_jobs,
            cancelled_ms or {},
        )
    recov = recovery_times(history, bound_s)
    for r in recov:
        if not r["within_bound"]:
            v["failover_over_bound"].append(
                f"fault {r['step']} {r['kind']} ({r['target']}): first ack "
                f"{r['from_start_s']}s after start, {r['from_heal_s']}s after heal; "
                f"bound {bound_s}s from its {r['bound_from']}"
            )
    v["rebuild_over_bound"] = slow_rebuilds(history, rebuild_bound_s)
    v["membership_divergence"] = list(history.membership)
    if members is not None:
        for label, views, alias in member_groups(members):
            diverged, stuck = membership_problems(
                views, members["names"], members["expected"], alias
            )
            v["membership_divergence"] += [label + d for d in diverged]
            v["stuck_learner"] += [label + s for s in stuck]
    sums: list[str] = []
    if not states:
        v["replica_divergence"].append(f"no consistent read of the nodes: {collect_info}")
    else:
        ref = states[collect_info.get("leader", 0)]
        sums = _check_replicas(states, ref, v)
        _check_jobs(history, states, ref, v, forgot, stats)
        skew_ms = max([abs(f.clock_shift_s) for f in history.faults] + [0.0]) * 1000
        all_runs = _check_runs(ref, executions, set(cron_jobs), recurring, skew_ms, v, stats)
        _check_executions(executions, all_runs, v, forgot, stats)
        stats["refused_then_recorded_succeeded"] = sum(
            1
            for r, f in refusals
            if r in all_runs
            and any(
                a["fence"] == f and a["outcome"] == "succeeded" for a in all_runs[r]["attempts"]
            )
        )
    stats["refused_completions"] = len(refusals)
    return _report(
        history,
        v,
        {"checksums": sums, **collect_info},
        executions,
        malformed,
        refusals,
        bound_s,
        cron_jobs,
        recov,
        stats,
    )


def check_recorded(
    history: History,
    states: list[NodeState],
    collect_info: dict[str, Any],
    records: list[Path],
    logs: list[Path],
    **options: Any,
) -> dict[str, Any]:
    """:func:`check` with the workers' evidence read from their execution records and logs."""
    executions, malformed = read_executions(records)
    refusals = read_refusals(logs)
    return check(history, states, collect_info, executions, malformed, refusals, **options)


def _check_replicas(states: list[NodeState], ref: NodeState, v: dict[str, list[str]]) -> list[str]:
    sums = [s.checksum() for s in states]
    mine = ref.checksum()
    for s, digest in zip(states, sums, strict=True):
        if digest != mine:
            diff = [
                j
                for j in set(s.jobs) | set(ref.jobs)
                if s.jobs.get(j) != ref.jobs.get(j) or s.runs.get(j) != ref.runs.get(j)
            ]
            v["replica_divergence"].append(
                f"node n{s.node + 1} checksum {digest[:12]} != leader n{ref.node + 1} "
                f"{mine[:12]}; differing jobs: {sorted(diff)[:5]}"
            )
    return sums


def _check_duplicates(
    history: History, states: list[NodeState], ref: NodeState, v: dict[str, list[str]]
) -> None:
    for s in states:
        for job_id, n in Counter(s.listed).items():
            if n > 1:
                v["duplicate_job_ids"].append(f"job {job_id} listed {n} times on n{s.node + 1}")
    by_tag: dict[str, list[str]] = defaultdict(list)
    for job_id, job in ref.jobs.items():
        tag = (job.get("payload") or {}).get("tag")
        if tag is not None:
            by_tag[tag].append(job_id)
    for tag, ids in by_tag.items():
        if len(ids) > 1:
            v["duplicate_job_ids"].append(f"one submission (tag {tag}) became jobs {ids}")
    for acked, n in Counter(op.job_id for op in history.ops if op.ok).items():
        if n > 1:
            v["duplicate_job_ids"].append(f"job id {acked} acknowledged to {n} submissions")


@dataclass
class Forgetting:
    """What history retention may have forgotten by the time the nodes were read."""

    before_ms: float  # wall-clock ms: only what last changed before this can be gone
    last_executed: dict[str, int]  # per job, its last recorded execution (wall-clock ms)
    recurring: set[str]  # cron and interval jobs: never forgotten while active
    kept: dict[str, dict[str, Any]]  # the jobs the leader still has
    cancelled: dict[str, int]  # recurring jobs the harness cancelled, when (wall-clock ms)

    def job(self, op: Op, states: list[NodeState]) -> bool:
        """A job may be gone when a worker ran it and it ended before ``before_ms``: a one-off
        job after its last execution, a recurring one after it was cancelled too; and every
        node lacks it alike."""
        job_id = op.job_id or ""
        ran = self.last_executed.get(job_id)
        if ran is None:
            return False
        if op.kind == "cron" or job_id in self.recurring:
            ran = max(ran, self.cancelled.get(job_id, 2**62))
        return ran < self.before_ms and all(job_id not in s.jobs for s in states)

    def run(self, run_id: str) -> bool:
        """A run may be gone when it was scheduled before ``before_ms`` and its job is a
        recurring one (whose old runs go while it stays) or is gone too."""
        job_id, _, scheduled = run_id.rpartition("@")
        return (
            scheduled.isdigit()
            and int(scheduled) < self.before_ms
            and (job_id in self.recurring or job_id not in self.kept)
        )


def _check_jobs(
    history: History,
    states: list[NodeState],
    ref: NodeState,
    v: dict[str, list[str]],
    forgot: Forgetting | None = None,
    stats: Counter[str] | None = None,
) -> None:
    """Acknowledged jobs present everywhere with their payload, no duplicates, none stuck."""
    _check_duplicates(history, states, ref, v)
    for op in history.ops:
        if not op.ok:
            continue
        if forgot is not None and forgot.job(op, states):
            if stats is not None:
                stats["forgotten_jobs"] += 1
            continue
        for s in states:
            job = s.jobs.get(op.job_id or "")
            if job is None:
                v["lost_acknowledged_jobs"].append(
                    f"op {op.op} (tag {op.tag}) acknowledged as {op.job_id} at "
                    f"t={op.completed}: missing on n{s.node + 1}"
                )
            elif job.get("payload") != op.body["payload"]:
                v["lost_acknowledged_jobs"].append(
                    f"job {op.job_id} on n{s.node + 1} has payload {job.get('payload')}, "
                    f"submitted {op.body['payload']}"
                )
        job = ref.jobs.get(op.job_id or "")
        if op.kind != "cron" and job is not None and job["status"] not in ("done", "cancelled"):
            latest = job.get("latest_run") or {}
            v["stuck_jobs"].append(
                f"job {op.job_id} status {job['status']}, latest run "
                f"{latest.get('id')} {latest.get('state')}"
            )


def _check_runs(
    ref: NodeState,
    executions: list[tuple[str, int, int, str]],
    cron: set[str],
    recurring: set[str],
    skew_ms: float,
    v: dict[str, list[str]],
    stats: Counter[str],
) -> dict[str, dict[str, Any]]:
    """Every run of every job: fires, leases, completions.  Returns the runs by id.  ``cron``:
    the jobs on a cron expression (their runs on whole seconds); ``recurring``: every job that
    may have more than one run."""
    execs_by_run: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for run_id, fence, attempt, src in executions:
        execs_by_run[run_id].append((fence, attempt, src))
    all_runs: dict[str, dict[str, Any]] = {}
    for job_id, runs in ref.runs.items():
        for when, n in Counter(r["scheduled_at"] for r in runs).items():
            if n > 1:
                v["duplicate_fires"].append(f"job {job_id}: {n} runs scheduled at {when}")
        if job_id not in recurring and len(runs) > 1:
            v["duplicate_fires"].append(f"one-off job {job_id} has {len(runs)} runs")
        for run in runs:
            all_runs[run["id"]] = run
            stats["runs"] += 1
            stats[f"runs_{run['state']}"] += 1
            stats["attempts"] += len(run["attempts"])
            ms = parse_ms(run["scheduled_at"])
            if job_id in cron and ms is not None and ms % 1000 != 0:
                v["duplicate_fires"].append(
                    f"cron run {run['id']} scheduled at {run['scheduled_at']}: not on the "
                    "cron's second (a colliding occurrence made unique)"
                )
            _check_attempts(run, v, skew_ms)
            _check_completion(run, execs_by_run.get(run["id"], []), v)
    return all_runs


def _check_executions(
    executions: list[tuple[str, int, int, str]],
    all_runs: dict[str, dict[str, Any]],
    v: dict[str, list[str]],
    forgot: Forgetting | None = None,
    stats: Counter[str] | None = None,
) -> None:
    """Each execution a worker made had a fence the log granted to that run, and ran once."""
    by_run: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for run_id, fence, attempt, src in executions:
        by_run[run_id].append((fence, attempt, src))
    for run_id, items in by_run.items():
        for (fence, _), n in Counter((f, a) for f, a, _ in items).items():
            if n > 1:
                v["duplicate_fires"].append(f"run {run_id} executed {n} times with fence {fence}")
        run = all_runs.get(run_id)
        if run is None and forgot is not None and forgot.run(run_id):
            if stats is not None:
                stats["executions_of_forgotten_runs"] += len(items)
            continue
        fences = {a["fence"]: a for a in run["attempts"]} if run else {}
        for fence, attempt, src in items:
            granted = fences.get(fence)
            if granted is None or granted["attempt"] != attempt:
                v["executions_without_lease"].append(
                    f"{src}: run {run_id} executed with fence {fence} attempt {attempt}; the "
                    f"log granted {sorted((a['fence'], a['attempt']) for a in fences.values())}"
                )


def _check_attempts(run: dict[str, Any], v: dict[str, list[str]], skew_ms: float) -> None:
    attempts = run["attempts"]
    for i, a in enumerate(attempts):
        if a["outcome"] is None and i != len(attempts) - 1:
            v["overlapping_leases"].append(
                f"run {run['id']}: attempt {a['attempt']} (fence {a['fence']}) never ended but "
                f"attempt {attempts[i + 1]['attempt']} (fence {attempts[i + 1]['fence']}) was leased"
            )
        if i + 1 < len(attempts):
            b = attempts[i + 1]
            if b["fence"] <= a["fence"]:
                v["overlapping_leases"].append(
                    f"run {run['id']}: fences not increasing: {a['fence']} then {b['fence']}"
                )
            end, start = parse_ms(a["ended_at"]), parse_ms(b["started_at"])
            if end is not None and start is not None and end > start + skew_ms:
                v["overlapping_leases"].append(
                    f"run {run['id']}: attempt {a['attempt']} ended {a['ended_at']} after "
                    f"attempt {b['attempt']} started {b['started_at']} (tolerance {skew_ms:.0f} ms)"
                )
    if run["state"] == "running" and (not attempts or attempts[-1]["outcome"] is not None):
        v["overlapping_leases"].append(f"run {run['id']} is running without an open attempt")


def _check_completion(
    run: dict[str, Any], execs: list[tuple[int, int, str]], v: dict[str, list[str]]
) -> None:
    attempts = run["attempts"]
    won = [a for a in attempts if a["outcome"] == "succeeded"]
    if run["state"] != "succeeded":
        if won:
            v["stale_completions"].append(
                f"run {run['id']} is {run['state']} with a succeeded attempt {won[0]['fence']}"
            )
        return
    if len(won) != 1:
        v["stale_completions"].append(f"run {run['id']}: {len(won)} succeeded attempts")
        return
    a = won[0]
    if a is not attempts[-1] or a["fence"] != max(x["fence"] for x in attempts):
        v["stale_completions"].append(
            f"run {run['id']}: completion accepted for fence {a['fence']} (attempt "
            f"{a['attempt']}) but the latest lease is fence {attempts[-1]['fence']}"
        )
    result = run.get("result")
    if isinstance(result, dict) and "attempt" in result:
        if result.get("attempt") != a["attempt"] or result.get("run_id") != run["id"]:
            v["stale_completions"].append(
                f"run {run['id']}: result {result} stored for succeeded attempt {a['attempt']}"
            )
    if not any(f == a["fence"] for f, _, _ in execs):
        v["stale_completions"].append(
            f"run {run['id']}: succeeded with fence {a['fence']} but no worker executed that "
            f"fence (executions: {sorted(execs)})"
        )


def _report(
    history: History,
    v: dict[str, list[str]],
    state_info: dict[str, Any],
    executions: list[tuple[str, int, int, str]],
    malformed: int,
    refusals: list[tuple[str, int]],
    bound_s: float,
    cron_jobs: list[str],
    recov: list[dict[str, Any]],
    stats: Counter[str] | None = None,
) -> dict[str, Any]:
    acked = [op for op in history.ops if op.ok]
    latencies = [op.completed - op.invoked for op in acked if op.completed is not None]
    failover = [
        r["from_start_s"] if r["bound_from"] == "start" else r["from_heal_s"] for r in recov
    ]
    failover_f = [x for x in failover if x is not None]
    return {
        "invariants": {k: len(v[k]) for k in INVARIANTS},
        "violations": {k: items[:20] for k, items in v.items() if items},
        "ok": all(not items for items in v.values()),
        "ops": {
            "submitted": len(history.ops),
            "acknowledged": len(acked),
            "unacknowledged": len(history.ops) - len(acked),
            "by_kind": dict(Counter(op.kind for op in acked)),
            "http_attempts": sum(len(op.attempts) for op in history.ops),
            "http_statuses": dict(
                Counter(str(a.status or "no reply") for op in history.ops for a in op.attempts)
            ),
            "submit_latency_p50_s": _pct(latencies, 0.5),
            "submit_latency_max_s": round(max(latencies), 3) if latencies else None,
        },
        "cron_jobs": len(cron_jobs),
        "runs": dict(stats or {}),
        "executions": len(executions),
        "malformed_execution_lines": malformed,
        "refused_completions": len(refusals),
        "faults": [asdict(f) for f in history.faults],
        "faults_by_kind": dict(Counter(f.kind for f in history.faults)),
        "recovery": recov,
        "failover_bound_s": bound_s,
        "failover_p50_s": _pct(failover_f, 0.5),
        "failover_max_s": max(failover_f) if failover_f else None,
        "failover_mean_s": round(statistics.fmean(failover_f), 3) if failover_f else None,
        "state": {k: val for k, val in state_info.items() if k != "views"},
        "notes": history.notes,
    }
