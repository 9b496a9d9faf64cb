"""Model objects rendered as the API's JSON, and the shape of every response body.

Pure.  Times are RFC 3339 in UTC (``format_time``); durations are numbers of seconds (an ``int``
when whole, a ``float`` otherwise); enums are their plain string values.

Each response body is declared here once, as a ``TypedDict`` that the code building it is typed
with (mypy checks the two agree); the OpenAPI document derives its response schemas from these
declarations (``schedd.api.schema``), and the live-answer tests check real responses against it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from schedd.api.schema import js, values
from schedd.auth import Role as TokenRole
from schedd.core.apply import MAX_CLAIMS
from schedd.core.durations import format_time
from schedd.core.events import Change
from schedd.core.model import (
    MAX_REFUSALS,
    Attempt,
    AttemptOutcome,
    DstGap,
    DstRepeat,
    Job,
    JobStatus,
    Misfire,
    Overlap,
    Priority,
    RecurringOptions,
    RetryPolicy,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
)
from schedd.errors import Code
from schedd.leader.progress import PROGRESS_PERIOD_S
from schedd.leader.workers import WorkerConn
from schedd.metrics import quantile
from schedd.protocol.messages import MAX_PROGRESS_BYTES, TRACEBACK_BYTES, TRACEBACK_LINES

__all__ = [
    "attempt_view",
    "job_view",
    "retry_view",
    "run_view",
    "schedule_view",
    "seconds",
    "waiting_reason",
    "worker_view",
]

Time = Annotated[str, js(format="date-time")]
Seconds = Annotated[int | float, js(minimum=0), "a duration in seconds (an integer when whole)"]
#: as Raft reports it; ``learner``: a node being added (it neither votes nor counts)
Role = Literal["leader", "follower", "candidate", "unknown", "learner"]
Cursor = Annotated[str | None, "pass as cursor for the next page; null at the end"]


class DstView(TypedDict):
    gap: Annotated[str, values(DstGap)]
    repeat: Annotated[str, values(DstRepeat)]


class _Recurring(TypedDict):
    timezone: str
    jitter: Seconds
    misfire: Annotated[str, values(Misfire)]
    catchup_window: Annotated[int | float | None, js(minimum=0)]
    overlap: Annotated[str, values(Overlap)]
    dst: DstView
    start_at: Time | None
    end_at: Time | None


class AtView(TypedDict):
    at: Time


# ("in" is a keyword: the functional form)
InView = TypedDict("InView", {"in": Seconds, "at": Time})


class EveryView(_Recurring):
    every: Seconds


class CronView(_Recurring):
    cron: str


JobSchedule = Annotated[
    AtView | InView | EveryView | CronView,
    "the schedule as given; null for run-now. An in schedule also shows its resolved time.",
]


class RetryPolicyView(TypedDict):
    max_attempts: Annotated[int, js(minimum=1)]
    initial: Seconds
    max: Seconds
    multiplier: float
    jitter: bool


class AttemptView(TypedDict):
    """One lease of a run to a worker."""

    attempt: Annotated[int, js(minimum=1)]
    fence: Annotated[int, "only grows; sent back by the worker"]
    worker_id: str
    started_at: Time
    deadline: Time | None
    ended_at: Time | None
    outcome: Annotated[str | None, values(AttemptOutcome)]
    error: str | None
    traceback: Annotated[
        str | None,
        f"the tail of the traceback of the exception the task raised (its last {TRACEBACK_LINES} "
        f"lines, at most {TRACEBACK_BYTES} bytes); null otherwise",
    ]
    progress: Annotated[
        Any,
        "the latest progress the worker reported (the task's ctx.progress, any JSON value up to "
        f"{MAX_PROGRESS_BYTES} bytes), recorded at most every {PROGRESS_PERIOD_S:g} s while the "
        "attempt runs, and with its end; null: none",
    ]
    progress_at: Annotated[Time | None, "when that progress was recorded"]


class RefusalView(TypedDict):
    """A worker's result refused because its fence was no longer the run's current lease."""

    fence: int
    worker_id: Annotated[str, "the worker of the attempt with that fence"]
    outcome: Annotated[str, "what the worker reported", values(AttemptOutcome)]
    at: Annotated[Time, "when the refusal was applied"]
    reason: str


class UpstreamView(TypedDict):
    """An upstream job (``depends_on``) of a run that waits for it or was skipped for it."""

    job_id: str
    name: str | None
    status: Annotated[str | None, "the upstream job's status (null: it no longer exists)"]
    run_id: Annotated[str | None, "its latest run (null: none)"]
    state: Annotated[str | None, "that run's state"]


class RunView(TypedDict):
    """One occurrence of a job."""

    id: Annotated[str, "opaque (<job_id>@<unix_ms>)"]
    job_id: str
    job_name: Annotated[str | None, "its job's name (null: none, or not known here)"]
    task: Annotated[str | None, "its job's task (null: not known here)"]
    namespace: str
    state: Annotated[str, values(RunState)]
    scheduled_at: Time
    due_at: Time
    created_at: Time
    updated_at: Time
    attempts: list[AttemptView]
    result: Annotated[Any, "the task's return value (any JSON value)"]
    error: str | None
    reason: Annotated[str | None, "why a run was skipped, cancelled or blocked"]
    waiting: Annotated[
        str | None,
        "for a queued run in a single job's or run's view: why no worker takes it (no connected "
        "worker, none on its queue, none that runs its task); null otherwise or when not known",
    ]
    upstream: NotRequired[
        Annotated[
            list[UpstreamView],
            "for a run blocked by its dependencies or skipped because one failed, in a single "
            "job's or run's view: its upstream jobs, each with its latest run",
        ]
    ]
    refused: Annotated[
        list[RefusalView],
        f"results refused for a stale fence (the latest {MAX_REFUSALS}, oldest first): a "
        "worker that lost its lease (a missed heartbeat, a timeout, a cancel) and finished anyway",
    ]
    shard: NotRequired[
        Annotated[int, js(minimum=0), "a cluster of several shards: the shard the run lives in"]
    ]


class JobView(TypedDict):
    """A job, with its next fire time and its latest run."""

    id: Annotated[str, "opaque"]
    task: str
    name: str | None
    namespace: str
    queue: str
    payload: Annotated[Any, "any JSON value"]
    schedule: JobSchedule | None
    priority: Annotated[str, values(Priority)]
    retry: RetryPolicyView
    timeout: Annotated[int | float | None, js(minimum=0)]
    heartbeat_timeout: Seconds
    depends_on: list[str]
    idempotency_key: str | None
    status: Annotated[str, values(JobStatus)]
    created_at: Time
    updated_at: Time
    next_run_at: Time | None
    latest_run: RunView | None
    shard: NotRequired[
        Annotated[int, js(minimum=0), "a cluster of several shards: the shard the job lives in"]
    ]
    warnings: NotRequired[
        Annotated[
            list[str],
            "only in the answer to a submit, when there is something to say: what will keep the "
            "job's runs waiting (no connected worker serves its task on its queue)",
        ]
    ]


class JobListView(TypedDict):
    jobs: list[JobView]
    next_cursor: Cursor
    places: NotRequired[
        Annotated[list[str], "with ?places: each job's own cursor (for a node's front door)"]
    ]


class BatchResultView(TypedDict):
    """the batch's jobs, in order"""

    jobs: list[JobView]


class RunListView(TypedDict):
    """newest first"""

    runs: list[RunView]
    next_cursor: Cursor
    places: NotRequired[
        Annotated[list[str], "with ?places: each run's own cursor (for a node's front door)"]
    ]


class TaskCountView(TypedDict):
    task: str
    count: Annotated[int, js(minimum=1)]


class DlqBulkView(TypedDict):
    """what a bulk replay or drop of the dead-letter queue did (dry_run: would do)"""

    action: Literal["replay", "drop"]
    dry_run: bool
    count: Annotated[int, js(minimum=0), "runs replayed or dropped (dry_run: that would be)"]
    tasks: Annotated[list[TaskCountView], "those runs by task, the most first"]
    run_ids: Annotated[list[str], "those runs, the last dead-lettered first"]
    skipped: Annotated[
        list[str],
        "runs named (or matched) but not in the queue when it came to them: replayed or "
        "dropped meanwhile",
    ]
    message: Annotated[str, 'for people: "replay 1,234 runs of 7 tasks"']


class FireView(TypedDict):
    scheduled_at: Time
    due_at: Annotated[Time, "scheduled_at plus jitter"]
    local: Annotated[Time, "scheduled_at in the schedule's zone, with offset"]
    note: Annotated[str | None, "set when a DST change moves, skips or doubles the fire"]


class ExplainView(TypedDict):
    """the next fire times"""

    fires: list[FireView]


class ClusterNodeView(TypedDict):
    id: Annotated[str | None, "null when not known"]
    raft: Annotated[str, "host:port"]
    http: Annotated[str | None, "the node's API URL"]
    role: Role
    self: bool
    healthy: bool
    version: Annotated[
        str | None, "the node's schedd version (null: not known yet, or it does not answer)"
    ]
    lag: Annotated[
        int | None,
        js(minimum=0),
        "entries behind the leader's commit index: known for every node when this node leads, "
        "else for itself (what it has not applied of the commit index it knows) and its leader "
        "(0); null otherwise",
    ]
    last_contact: Annotated[
        float | None,
        js(minimum=0),
        "seconds since the leader last heard from the node (when this node leads), or since "
        "this follower last heard from its leader (itself and the leader); 0 for the leader "
        "itself; null when not known",
    ]
    connected: NotRequired[Annotated[bool, "peers only"]]
    voting: NotRequired[
        Annotated[
            bool,
            "this node only: false while it abstains from elections, having started with an "
            "empty data directory beside peers that hold data, until it has caught up with a "
            "leader",
        ]
    ]
    match_index: NotRequired[Annotated[int | None, "peers only, when this node leads"]]


class LeaderClaimView(TypedDict):
    """A leader's claim of its term: the first entry it committed as leader."""

    term: Annotated[int, js(minimum=1)]
    node: str
    index: Annotated[int, js(minimum=1), "the claim's log index (the leader's fence)"]
    at: Annotated[Time, "the new leader's clock when it claimed"]


class ShardView(TypedDict):
    """one shard (Raft group) of a cluster of several, as this node's process of it sees it"""

    shard: Annotated[int, js(minimum=0)]
    role: Role
    leader: Annotated[str | None, "node id (or Raft address)"]
    leader_url: str | None
    term: Annotated[int, js(minimum=0)]
    commit_index: Annotated[int, js(minimum=0)]
    applied_index: Annotated[int, js(minimum=0)]
    state_index: Annotated[int, js(minimum=0), "the last applied entry that reads see"]
    lag: Annotated[int, js(minimum=0), "entries committed and not yet applied on this node"]


class ClusterView(TypedDict):
    """this node's view of the cluster"""

    node_id: str
    role: Role
    leader: Annotated[str | None, "node id (or Raft address)"]
    leader_url: str | None
    term: Annotated[int, js(minimum=0)]
    commit_index: Annotated[int, js(minimum=0)]
    applied_index: Annotated[int, js(minimum=0)]
    state_index: Annotated[int, js(minimum=0), "the last applied entry that reads see"]
    has_quorum: bool
    ready: bool
    nodes: list[ClusterNodeView]
    leaders: Annotated[
        list[LeaderClaimView],
        f"the latest leader changes, oldest first (at most {MAX_CLAIMS}), as this node's "
        "reads see them",
    ]
    shards: NotRequired[
        Annotated[
            list[ShardView],
            "a cluster of several shards: each shard's leader, term and lag (the rest of this "
            "view is shard 0's)",
        ]
    ]


class MemberView(TypedDict):
    """a member of the cluster"""

    id: Annotated[str | None, "its node.id (null: not known yet, a learner added by address)"]
    raft: Annotated[str, "host:port"]
    http: Annotated[str | None, "its API URL (null: not known yet)"]
    role: Annotated[
        Literal["voter", "learner"],
        "voter: counts towards a majority; learner: being added, catching up",
    ]
    leader: bool
    self: Annotated[bool, "the node that answered"]
    connected: Annotated[bool, "to the node that answered"]
    match_index: NotRequired[Annotated[int | None, "when the node that answered leads"]]
    lag: NotRequired[
        Annotated[int | None, js(minimum=0), "entries behind the commit index (leader only)"]
    ]


class MembersView(TypedDict):
    """the cluster's membership"""

    index: Annotated[int, js(minimum=0), "the log index of the latest change (0: none yet)"]
    cluster: Annotated[str | None, "the cluster's id (null until the membership is recorded)"]
    source: Annotated[
        Literal["log", "config"], "log: recorded by a change; config: the nodes' raft.peers"
    ]
    nodes: list[MemberView]
    removed: Annotated[list[str], "Raft addresses of removed nodes (refused if they return)"]
    quorum: Annotated[int, js(minimum=1), "voters needed for a majority"]


class _MembershipRecord(TypedDict):
    index: int
    voters: list[list[str]]
    learner: list[str] | None
    removed: list[str]
    cluster: str


class JoinAnswerView(TypedDict):
    """the membership the joining node goes by (it is the learner)"""

    members: _MembershipRecord


class CapsAnswerView(TypedDict, total=False):
    """a shard leader's answer about concurrency caps (by op)"""

    namespaces: Annotated[dict[str, Any], "view: allowance, in_use, waiting by namespace"]
    outbox: Annotated[list[Any], "view: transfers given, not known to be credited"]
    seq: Annotated[int, "give: the transfer"]
    amount: Annotated[int, "give: slots given (0: none was free)"]
    credited: Annotated[bool, "take: credited now (false: before)"]


class WorkerView(TypedDict):
    worker_id: str
    queues: list[str]
    tasks: Annotated[list[str] | None, "the tasks it runs (null: any task: it did not say)"]
    capacity: Annotated[int, js(minimum=1)]
    leases: Annotated[int, js(minimum=0), "leases in flight"]
    connected_at: Time
    draining: bool
    node: Annotated[str, "the node whose websocket it holds: the leader"]
    host: Annotated[str | None, "the address it connects from, as that node sees it"]
    last_heard: Annotated[Time, "when a frame (a heartbeat, a result) last came from it"]


class WorkersView(TypedDict):
    """the workers connected to the leader"""

    workers: list[WorkerView]


class LagGroupView(TypedDict):
    queue: str
    priority: Annotated[str, values(Priority)]
    count: Annotated[int, js(minimum=0), "observations in the window"]
    p50: Annotated[float | None, js(minimum=0), "seconds; null without observations"]
    p99: Annotated[float | None, js(minimum=0), "seconds; null without observations"]


class LagView(TypedDict):
    """one lag's observations in the window: all of them, and by queue and priority"""

    count: Annotated[int, js(minimum=0)]
    p50: Annotated[float | None, js(minimum=0), "seconds; null without observations"]
    p99: Annotated[float | None, js(minimum=0), "seconds; null without observations"]
    by: Annotated[list[LagGroupView], "by queue, then priority"]


class SkipCountView(TypedDict):
    reason: str
    count: Annotated[int, js(minimum=0)]


#: one run's lag, compact: [due_ms, lag_s, queue, priority] (``Metrics.*_samples``)
LagSampleView = Annotated[
    list[Any],
    js(
        prefixItems=[
            {"type": "integer", "description": "when the run was due, in ms since the epoch"},
            {"type": "number", "minimum": 0, "description": "its lag, in seconds"},
            {"type": "string", "description": "its queue"},
            {"type": "string", "enum": [p.value for p in Priority]},
        ],
        items=False,
        minItems=4,
    ),
    "[due_ms, lag_s, queue, priority]",
]


class LagSamplesView(TypedDict):
    """each run's lag in the window, oldest first (the last 15 minutes at most, the newest 5000
    of each)"""

    fire: Annotated[list[LagSampleView], "from due to fire, as in fire"]
    lease: Annotated[list[LagSampleView], "from due to lease (start), as in lease"]


class SchedulingLagView(TypedDict):
    """how late the leader schedules: quantiles over the last minutes and what waits now"""

    leader: Annotated[str, "the node whose observations these are (the leader)"]
    window: Annotated[Seconds, "the last this many seconds"]
    fire: Annotated[
        LagView, "from a run's due time to its fire (queued for a worker) being committed"
    ]
    lease: Annotated[
        LagView,
        "from a run's due time to its lease, which is when its attempt starts (a run leased "
        "ahead of its due time starts then: 0)",
    ]
    due_not_leased: Annotated[int, js(minimum=0), "queued + overdue, now"]
    queued: Annotated[int, js(minimum=0), "runs due and queued for a worker, now"]
    overdue: Annotated[
        int,
        js(minimum=0),
        "runs whose time has come but that are not fired yet (jobs not paused), now",
    ]
    misfires: Annotated[int, js(minimum=0), "occurrences skipped as misfires, ever"]
    skipped: Annotated[list[SkipCountView], "occurrences that did not run, ever, by reason"]
    samples: NotRequired[
        Annotated[LagSamplesView, "with samples=true: each observation of the window, one by one"]
    ]


class LoginCodeView(TypedDict):
    """a one-time code that opens a dashboard session on this node"""

    code: Annotated[str, "good once, on this node, until expires_at"]
    expires_at: Time
    path: Annotated[str, "the dashboard's address on this node with the code (/ui/#code=…)"]


class SessionView(TypedDict):
    """a dashboard session: a bearer token like the tokens file's, until it expires"""

    token: Annotated[str, "send it as 'Authorization: Bearer <token>'"]
    name: Annotated[str, "the name of the token that asked for the code"]
    role: Annotated[str, values(TokenRole)]
    expires_at: Time


class WhoamiView(TypedDict):
    """the caller's token: who it is and what it may do"""

    name: Annotated[str, "the token's name in the tokens file"]
    role: Annotated[str, values(TokenRole)]
    actions: Annotated[
        list[str],
        "the actions its role allows (read, submit, admin, worker), sorted: an operation's "
        "x-required-role in the OpenAPI document is one of them",
    ]
    operations: Annotated[list[str], "the operationIds of the OpenAPI document it may call, sorted"]


Index = Annotated[int, js(minimum=0), "the Raft index of the entry that made the change"]


class JobChangeView(TypedDict):
    """a job as an entry left it (GET /events, event job)"""

    index: Index
    id: str
    namespace: str
    queue: str
    task: str
    name: str | None
    status: Annotated[str, values(JobStatus)]
    next_run_at: Time | None
    updated_at: Time
    forgotten: Annotated[bool, "the job was forgotten (history retention); nothing more follows"]


class RunChangeView(TypedDict):
    """a run as an entry left it (GET /events, event run); a progress report is no change"""

    index: Index
    id: str
    job_id: str
    namespace: str
    state: Annotated[str, values(RunState)]
    attempt: Annotated[int, js(minimum=0), "the number of its latest attempt (0: none yet)"]
    fence: Annotated[int | None, "the latest attempt's fence"]
    worker_id: Annotated[str | None, "the latest attempt's worker"]
    due_at: Time
    updated_at: Time
    reason: str | None
    forgotten: Annotated[bool, "the run was forgotten (history retention); nothing more follows"]


class DlqChangeView(TypedDict):
    """a run entered (in_dlq true) or left the dead-letter queue (GET /events, event dlq)"""

    index: Index
    run_id: str
    job_id: str
    namespace: str
    in_dlq: bool


class ClusterChangeView(TypedDict):
    """a new leader claimed its term (GET /events, event cluster)"""

    index: Index
    leader: Annotated[str, "the leader's node id"]
    term: Annotated[int, js(minimum=0)]
    leader_url: Annotated[str | None, "the leader's API URL"]


class StreamStartView(TypedDict):
    """the first event of a stream (hello), and the one that says the client missed changes
    (reset): the changes after index `after` follow"""

    node_id: Annotated[str, "the node that streams"]
    after: Annotated[int, js(minimum=0), "the events that follow are of entries after it"]
    reason: NotRequired[Annotated[str, "reset only: why the client must read its pages again"]]


class HealthView(TypedDict):
    status: Literal["ok"]
    node_id: str
    version: Annotated[str, "the node's schedd version"]


class ReadyView(TypedDict):
    status: Literal["ready"]
    leader: Annotated[str, "the leader's Raft address"]


class ErrorDetail(TypedDict):
    code: Annotated[str, values(Code)]
    message: Annotated[str, "what was expected"]
    field: NotRequired[
        Annotated[str, "the offending value's path, like schedule.cron or jobs[3].task"]
    ]


class ErrorView(TypedDict):
    error: ErrorDetail


#: the response bodies, by their name in the OpenAPI document's components
RESPONSES: dict[str, Any] = {
    "JobSchedule": JobSchedule,
    "RetryPolicy": RetryPolicyView,
    "Job": JobView,
    "Attempt": AttemptView,
    "Run": RunView,
    "JobList": JobListView,
    "BatchResult": BatchResultView,
    "RunList": RunListView,
    "Fire": FireView,
    "TaskCount": TaskCountView,
    "DlqBulkResult": DlqBulkView,
    "Explain": ExplainView,
    "ClusterNode": ClusterNodeView,
    "Cluster": ClusterView,
    "Members": MembersView,
    "JoinAnswer": JoinAnswerView,
    "CapsAnswer": CapsAnswerView,
    "Worker": WorkerView,
    "Workers": WorkersView,
    "Whoami": WhoamiView,
    "LoginCode": LoginCodeView,
    "Session": SessionView,
    "LagGroup": LagGroupView,
    "Lag": LagView,
    "SkipCount": SkipCountView,
    "SchedulingLag": SchedulingLagView,
    "JobChange": JobChangeView,
    "RunChange": RunChangeView,
    "DlqChange": DlqChangeView,
    "ClusterChange": ClusterChangeView,
    "StreamStart": StreamStartView,
    "Health": HealthView,
    "Ready": ReadyView,
    "Error": ErrorView,
}


def seconds(ms: int) -> int | float:
    """Milliseconds → seconds: ``90000`` → ``90``, ``1500`` → ``1.5``."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def _opt_seconds(ms: int | None) -> int | float | None:
    return None if ms is None else seconds(ms)


def schedule_view(schedule: Schedule) -> AtView | InView | EveryView | CronView | None:
    """The schedule as it was given; ``None`` for run-now.  ``in`` also shows the resolved time.
    The recurring options are shown as the API takes them (a client reads back what it set)."""
    kind = schedule.kind
    if kind is ScheduleKind.AT and schedule.at_ms is not None:
        return {"at": format_time(schedule.at_ms)}
    if kind is ScheduleKind.IN and schedule.in_ms is not None and schedule.at_ms is not None:
        return {"in": seconds(schedule.in_ms), "at": format_time(schedule.at_ms)}
    o = schedule.options or RecurringOptions()
    if kind is ScheduleKind.EVERY and schedule.every_ms is not None:
        return {"every": seconds(schedule.every_ms), **_recurring_view(schedule.timezone, o)}
    if kind is ScheduleKind.CRON and schedule.cron is not None:
        return {"cron": schedule.cron, **_recurring_view(schedule.timezone, o)}
    return None


def _recurring_view(timezone: str, o: RecurringOptions) -> _Recurring:
    return {
        "timezone": timezone,
        "jitter": seconds(o.jitter_ms),
        "misfire": o.misfire.value,
        "catchup_window": _opt_seconds(o.catchup_window_ms),
        "overlap": o.overlap.value,
        "dst": {"gap": o.dst_gap.value, "repeat": o.dst_repeat.value},
        "start_at": format_time(o.start_at_ms),
        "end_at": format_time(o.end_at_ms),
    }


def retry_view(retry: RetryPolicy) -> RetryPolicyView:
    return {
        "max_attempts": retry.max_attempts,
        "initial": seconds(retry.initial_ms),
        "max": seconds(retry.max_ms),
        "multiplier": retry.multiplier,
        "jitter": retry.jitter,
    }


def attempt_view(a: Attempt) -> AttemptView:
    return {
        "attempt": a.number,
        "fence": a.fence,
        "worker_id": a.worker_id,
        "started_at": format_time(a.leased_ms),
        "deadline": format_time(a.deadline_ms),
        "ended_at": format_time(a.ended_ms),
        "outcome": None if a.outcome is None else a.outcome.value,
        "error": a.error,
        "traceback": a.traceback,
        "progress": a.progress,
        "progress_at": format_time(a.progress_ms),
    }


def run_view(run: Run, job: Job | None = None) -> RunView:
    """``run`` as the API shows it; ``job``, its job, names it (else ``job_name`` and ``task``
    are null)."""
    view: RunView = {
        "id": run.id,
        "job_id": run.job_id,
        "job_name": None if job is None else job.spec.name,
        "task": None if job is None else job.spec.task,
        "namespace": run.namespace,
        "state": run.state.value,
        "scheduled_at": format_time(run.scheduled_ms),
        "due_at": format_time(run.due_ms),
        "created_at": format_time(run.created_ms),
        "updated_at": format_time(run.updated_ms),
        "attempts": [attempt_view(a) for a in run.attempts],
        "result": run.result,
        "error": run.error,
        "reason": run.reason,
        "waiting": None,
        "refused": [
            {
                "fence": f.fence,
                "worker_id": f.worker_id,
                "outcome": f.outcome.value,
                "at": format_time(f.at_ms),
                "reason": f.reason,
            }
            for f in run.refused
        ],
    }
    if (shard := VIEW_SHARD.get()) is not None:
        view["shard"] = shard
    return view


#: the shard this request's node process serves, in a cluster of several (set for each request
#: by the API's middleware; None with one shard): job and run views then say it
VIEW_SHARD: ContextVar[int | None] = ContextVar("view_shard", default=None)


def job_view(job: Job, latest: Run | None) -> JobView:
    spec = job.spec
    view: JobView = {
        "id": job.id,
        "task": spec.task,
        "name": spec.name,
        "namespace": spec.namespace,
        "queue": spec.queue,
        "payload": spec.payload,
        "schedule": schedule_view(spec.schedule),
        "priority": spec.priority.value,
        "retry": retry_view(spec.retry),
        "timeout": _opt_seconds(spec.timeout_ms),
        "heartbeat_timeout": seconds(spec.heartbeat_timeout_ms),
        "depends_on": list(spec.depends_on),
        "idempotency_key": spec.idempotency_key,
        "status": job.status.value,
        "created_at": format_time(job.created_ms),
        "updated_at": format_time(job.updated_ms),
        "next_run_at": format_time(job.next_run_at_ms),
        "latest_run": None if latest is None else run_view(latest, job),
    }
    if (shard := VIEW_SHARD.get()) is not None:
        view["shard"] = shard
    return view


def worker_view(w: WorkerConn) -> WorkerView:
    return {
        "worker_id": w.worker_id,
        "queues": list(w.queues),
        "tasks": None if w.tasks is None else sorted(w.tasks),
        "capacity": w.capacity if w.whole_capacity is None else w.whole_capacity,
        "leases": len(w.leases),
        "connected_at": format_time(w.connected_at_ms),
        "draining": w.draining,
        "node": w.node,
        "host": w.host,
        "last_heard": format_time(w.heard_ms),
    }


def waiting_reason(task: str, queue: str, workers: Sequence[WorkerView]) -> str | None:
    """Why a queued run of ``task`` on ``queue`` is not taken by the ``workers`` connected to the
    leader; None when one of them runs it (it waits for room, or is being leased)."""
    if not workers:
        return f"no worker is connected: task {task!r} on queue {queue!r} waits for one"
    takers = [w for w in workers if queue in w["queues"]]
    if not takers:
        return f"no connected worker takes queue {queue!r} (task {task!r} waits for one)"
    servers = [w for w in takers if w["tasks"] is None or task in w["tasks"]]
    if not servers:
        served = sorted({t for w in takers for t in w["tasks"] or ()})
        close = difflib.get_close_matches(task, served, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"no connected worker serves task {task!r} on queue {queue!r}{hint}"
    if all(w["draining"] for w in servers):
        return (
            f"every connected worker that serves task {task!r} on queue {queue!r} is draining "
            "(it takes no new work)"
        )
    return None


ChangeView = JobChangeView | RunChangeView | DlqChangeView | ClusterChangeView


def change_view(change: Change) -> ChangeView:
    """A change of ``GET /events`` as its client gets it (``schedd.core.events.Change``)."""
    f = change.fields
    if change.kind == "run":
        state, attempt, fence, worker, due, updated, reason, forgotten = f
        return {
            "index": change.entry,
            "id": change.key,
            "job_id": change.job_id,
            "namespace": change.namespace,
            "state": state,
            "attempt": attempt,
            "fence": fence,
            "worker_id": worker,
            "due_at": format_time(due) or "",
            "updated_at": format_time(updated) or "",
            "reason": reason,
            "forgotten": forgotten,
        }
    if change.kind == "job":
        status, next_at, updated, queue, task, name, forgotten = f
        return {
            "index": change.entry,
            "id": change.key,
            "namespace": change.namespace,
            "queue": queue,
            "task": task,
            "name": name,
            "status": status,
            "next_run_at": format_time(next_at),
            "updated_at": format_time(updated) or "",
            "forgotten": forgotten,
        }
    if change.kind == "dlq":
        return {
            "index": change.entry,
            "run_id": change.key,
            "job_id": change.job_id,
            "namespace": change.namespace,
            "in_dlq": f[0],
        }
    leader, term, http = f
    return {"index": change.entry, "leader": leader, "term": term, "leader_url": http or None}


def lag_view(counts: Mapping[tuple[str, str], Sequence[int]], bounds: Sequence[float]) -> LagView:
    """A lag window's bucket counts per (queue, priority) as quantiles (``Metrics.*_window``)."""
    groups: list[LagGroupView] = []
    total = [0] * (len(bounds) + 1)
    for (queue, priority), group in sorted(counts.items()):
        for i, n in enumerate(group):
            total[i] += n
        groups.append(
            {
                "queue": queue,
                "priority": priority,
                "count": sum(group),
                "p50": _rounded(quantile(0.5, group, bounds)),
                "p99": _rounded(quantile(0.99, group, bounds)),
            }
        )
    return {
        "count": sum(total),
        "p50": _rounded(quantile(0.5, total, bounds)),
        "p99": _rounded(quantile(0.99, total, bounds)),
        "by": groups,
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
