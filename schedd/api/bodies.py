"""The request bodies the API takes, declared once as ``TypedDict`` s (the OpenAPI document's
request schemas are derived from them, ``schedd.api.schema``).

What a field may hold comes from the validator that enforces it (``schedd.core.validate``: the
field lists, patterns, limits and enums); ``tests/unit/test_api_schema.py`` checks that the
keys declared here are the keys the validator takes.  ``null`` for an optional field means "the
default".  Limits that depend on the config (``scheduler.max_payload``, ``http.max_body``,
``limits.max_batch``) are named in descriptions with their defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, NotRequired, Required, TypedDict

from schedd.api.schema import Ref, js, values
from schedd.core.model import DstGap, DstRepeat, Misfire, Overlap, Priority
from schedd.core.validate import (
    IDENT_PATTERN,
    MAX_ATTEMPTS,
    MAX_DEPENDS_ON,
    MAX_TEXT,
    TASK_PATTERN,
    ZONE_PATTERN,
)

MAX_SECONDS: Final = 100 * 365 * 86_400  # the longest duration the server accepts
# What parse_duration takes as text: "90s", "5m", "1h30m", "250ms", "2d" (spaces are ignored),
# or a plain decimal number of seconds.
DURATION_PATTERN: Final = (
    r"^\s*(?:(?:[0-9]+(?:\.[0-9]+)? *(?:ms|s|m|h|d) *)+|[0-9]+(?:\.[0-9]+)?)\s*$"
)


def duration(minimum_s: float, description: str) -> dict[str, Any]:
    """A duration: a number of seconds or a string like ``"90s"``, ``"5m"``, ``"1h30m"``."""
    return {
        "description": description,
        "oneOf": [
            {"type": "number", "minimum": minimum_s, "maximum": MAX_SECONDS},
            {"type": "string", "maxLength": 64, "pattern": DURATION_PATTERN},
        ],
    }


# Named schemas that are not objects (each a component of its own).
Duration = Annotated[Any, Ref("Duration")]
DurationOrZero = Annotated[Any, Ref("DurationOrZero")]
Ident = Annotated[str, Ref("Ident")]
SCALARS: Final[dict[str, dict[str, Any]]] = {
    "Duration": duration(
        0.001,
        'a duration: a number of seconds or a string like "90s", "5m", "1h30m"; more than '
        "zero, at most 100 years",
    ),
    "DurationOrZero": duration(
        0,
        'a duration: a number of seconds or a string like "90s", "5m", "1h30m"; zero '
        "allowed, at most 100 years",
    ),
    "DurationAtLeast1s": duration(
        1,
        'a duration: a number of seconds or a string like "90s", "5m", "1h30m"; at least 1s, '
        "at most 100 years",
    ),
    "Ident": {
        "type": "string",
        "pattern": f"^{IDENT_PATTERN}$",
        "description": "1 to 64 lowercase letters, digits, - and _",
    },
}

Time = Annotated[str, js(format="date-time")]
Text = Annotated[str, js(minLength=1, maxLength=MAX_TEXT)]


class DstBody(TypedDict, total=False):
    """what to do with local times that do not exist (gap) or happen twice (repeat) around
    daylight-saving changes"""

    gap: Annotated[str | None, values(DstGap), f"default {DstGap.SHIFT.value}"]
    repeat: Annotated[str | None, values(DstRepeat), f"default {DstRepeat.FIRST.value}"]


class RetryBody(TypedDict, total=False):
    """exponential backoff between attempts; initial <= max"""

    max_attempts: Annotated[
        int | None,
        js(minimum=1, maximum=MAX_ATTEMPTS),
        "default scheduler.default_max_attempts",
    ]
    initial: Annotated[Duration | None, "default 1s"]
    max: Annotated[Duration | None, "default 10m"]
    multiplier: Annotated[float | None, js(minimum=1, maximum=10), "default 2"]
    jitter: Annotated[bool | None, "default true"]


class _Recurring(TypedDict, total=False):
    timezone: Annotated[
        str | None,
        js(maxLength=64, pattern=f"^{ZONE_PATTERN}$"),
        'an IANA time zone like "Europe/Berlin"; default "UTC"',
    ]
    jitter: Annotated[
        DurationOrZero | None,
        "a random delay added to each fire time, shorter than an every interval; default 0",
    ]
    misfire: Annotated[
        str | None,
        values(Misfire),
        "fire times missed while no leader was scheduling; run_all is bounded by "
        f"catchup_window; default {Misfire.RUN_ONCE.value}",
    ]
    catchup_window: Duration | None
    overlap: Annotated[
        str | None,
        values(Overlap),
        "a fire time that comes while the previous run is still going; default "
        f"{Overlap.SKIP.value}",
    ]
    dst: DstBody | None
    start_at: Time | None
    end_at: Annotated[Time | None, "after start_at"]


class _OneOff(TypedDict, total=False):
    # the recurring options only go with every and cron
    timezone: None
    jitter: None
    misfire: None
    catchup_window: None
    overlap: None
    dst: None
    start_at: None
    end_at: None


CRON_TEXT: Final = (
    'a cron expression of 5 fields ("0 2 * * *"), 6 with seconds as the last field, or @yearly, '
    "@annually, @monthly, @weekly, @daily, @midnight, @hourly; no random (R) or hashed (H) "
    "fields"
)
Cron = Annotated[
    str,
    js(minLength=1, maxLength=MAX_TEXT, pattern=r"^\s*(?:@[A-Za-z]+|\S+(?:\s+\S+){4,5})\s*$"),
    CRON_TEXT,
]
Every = Annotated[
    Any,
    Ref("DurationAtLeast1s"),
    "run every interval (at least 1s), counted from the submission (or start_at)",
]


class _NoAt(TypedDict, total=False):
    at: None


class _NoEvery(TypedDict, total=False):
    every: None


class _NoCron(TypedDict, total=False):
    cron: None


# ("in" is a keyword: the functional form)
_NoIn = TypedDict("_NoIn", {"in": None}, total=False)


class _At(TypedDict):
    at: Annotated[Time, "run once at this time (RFC 3339)"]


_In = TypedDict("_In", {"in": Annotated[DurationOrZero, "run once after this delay"]})


class _Every(TypedDict):
    every: Every


class _Cron(TypedDict):
    cron: Cron


# Exactly one of at/in/every/cron is set (the others absent or null).
class ScheduleAt(_At, _NoIn, _NoEvery, _NoCron, _OneOff):
    pass


class ScheduleIn(_In, _NoAt, _NoEvery, _NoCron, _OneOff):
    pass


class ScheduleEvery(_Every, _NoAt, _NoIn, _NoCron, _Recurring):
    pass


class ScheduleCron(_Cron, _NoAt, _NoIn, _NoEvery, _Recurring):
    pass


Schedule = Annotated[
    ScheduleAt | ScheduleIn | ScheduleEvery | ScheduleCron,
    'when to run: {"at": TIME}, {"in": DURATION}, {"every": DURATION, ...} or {"cron": EXPR, ...}',
]


class _Task(TypedDict):
    task: Annotated[
        str,
        js(pattern=f"^{TASK_PATTERN}$"),
        'the task name workers register, like "reports.generate"',
    ]


class JobBody(_Task, total=False):
    """A job submission; only task is required, null means the default."""

    name: Annotated[Text | None, "a name for people"]
    namespace: Annotated[Ident | None, 'the tenant; default "default"']
    queue: Annotated[Ident | None, 'the worker lane; default "default"']
    payload: Annotated[
        Any,
        "any JSON value, handed to the task; at most scheduler.max_payload bytes encoded "
        "(default 65536, else 413)",
    ]
    schedule: Annotated[Schedule | None, "absent or null: run now"]
    priority: Annotated[str | None, values(Priority), f"default {Priority.NORMAL.value}"]
    retry: RetryBody | None
    timeout: Annotated[
        Duration | None, "an attempt running longer is cancelled and retried; default none"
    ]
    heartbeat_timeout: Annotated[
        Annotated[Any, Ref("DurationAtLeast1s")] | None,
        "a lease whose heartbeats stop this long is lost; at least 1s; default "
        "scheduler.heartbeat_timeout",
    ]
    depends_on: Annotated[
        list[Annotated[Text, "a job id of the same namespace"]] | None,
        js(maxItems=MAX_DEPENDS_ON, uniqueItems=True),
        "jobs that must succeed first",
    ]
    idempotency_key: Annotated[
        Text | None,
        "a repeated key (per namespace) returns the existing job with 200 instead of creating "
        "another; reused with another task or payload, a 409",
    ]


class BatchJob(JobBody, total=False):
    """A job of a batch: a JobBody plus an optional ref."""

    ref: Annotated[
        Text | None,
        "a name for this job that other jobs of the same batch can use in depends_on (the "
        "server assigns the ids)",
    ]


class Batch(TypedDict):
    """All or nothing, committed as one Raft entry; at most limits.max_batch jobs (default
    10000)."""

    jobs: Annotated[list[BatchJob], js(minItems=1)]


class _JobPatch(TypedDict, total=False):
    """Changes that apply to runs not yet started; at least one field. A one-off job whose run
    already started cannot change (409)."""

    paused: Annotated[bool | None, "pause or resume"]
    schedule: Annotated[Schedule | None, "replaces the pending occurrence; null: run now"]
    payload: Annotated[Any, "any JSON value; replaces the payload"]
    priority: Annotated[str | None, values(Priority)]
    retry: Annotated[
        RetryBody | None,
        "replaces the whole policy (unset keys take their defaults); null: no change",
    ]
    timeout: Annotated[Duration | None, "null removes the timeout"]


JobPatch = Annotated[_JobPatch, js(minProperties=1)]


class Trigger(TypedDict, total=False):
    """respect (the default) applies the job's overlap policy; override runs now regardless"""

    overlap: Literal["respect", "override"]


class DlqBulkBody(TypedDict, total=False):
    """Which runs of the dead-letter queue: those matching the filters (none: all of them), or
    those run_ids names (not both); at most limits.max_bulk (default 10000), else 400."""

    dry_run: Required[
        Annotated[bool, "true: answer what would be done and do nothing; false: do it"]
    ]
    namespace: Annotated[Ident | None, "only runs of this namespace"]
    queue: Annotated[Ident | None, "only runs of jobs on this queue"]
    task: Annotated[
        Annotated[str, js(pattern=f"^{TASK_PATTERN}$")] | None, "only runs of this task"
    ]
    since: Annotated[Time | None, "only runs that failed at or after this time"]
    error: Annotated[Text | None, "only runs whose error contains this text (either case)"]
    run_ids: Annotated[
        list[Annotated[Text, "a run id"]] | None,
        js(minItems=1, uniqueItems=True),
        "these runs (those not in the queue are skipped), instead of filters",
    ]


class LoginCodeBody(TypedDict, total=False):
    """a one-time code for the dashboard (schedctl ui)"""

    read_only: Annotated[bool, "the session opened with it has the read role (default false)"]


class LoginBody(TypedDict):
    """a one-time code to exchange for a dashboard session"""

    code: Annotated[str, js(minLength=1, maxLength=100), "from POST /login/codes"]


HostPort = Annotated[str, js(minLength=3, maxLength=300, pattern="^[^\\s]+:[0-9]{1,5}$")]


class NodeBody(TypedDict, total=False):
    """a node to add (schedctl node add)"""

    raft: Required[Annotated[HostPort, "the new node's raft.listen (host:port)"]]
    id: Annotated[str, js(maxLength=64), "its node.id (else it says so when it connects)"]
    http: Annotated[str, js(maxLength=300), "its API URL (else it says so when it connects)"]


class JoinBody(TypedDict):
    """a join request of a new node (raft.join)"""

    raft: Annotated[HostPort, "the joining node's raft.listen"]
    id: Annotated[str, js(minLength=1, maxLength=64), "its node.id"]
    http: Annotated[str, js(maxLength=300), "its API URL"]
    at: Annotated[int, js(minimum=0), "its clock, Unix ms"]
    data: Annotated[bool, "whether it holds data (only an empty node may join)"]
    proof: Annotated[str, js(maxLength=128), "HMAC-SHA256 (hex) of raft, id, http, at and cluster"]
    cluster: NotRequired[
        Annotated[str, js(maxLength=64), "the cluster id it expects (its raft.cluster_id)"]
    ]


class CapsBody(TypedDict, total=False):
    """a request between the nodes of a cluster of several shards about concurrency caps"""

    op: Required[Annotated[Literal["view", "limit", "give", "take", "delivered"], "what to do"]]
    at: Required[Annotated[int, js(minimum=0), "the caller's clock, Unix ms"]]
    proof: Required[Annotated[str, js(maxLength=128), "HMAC-SHA256 (hex) of the other fields"]]
    limits: Annotated[dict[str, int], "limit: runs of each namespace leased at once at most"]
    hold_s: Annotated[float, "limit: for this many seconds"]
    namespace: Annotated[str, "give, take: the namespace"]
    amount: Annotated[int, js(minimum=1), "give, take: slots"]
    dest: Annotated[int, js(minimum=0), "give: to this shard; delivered: credited there"]
    source: Annotated[int, js(minimum=0), "take: from this shard"]
    seq: Annotated[int, js(minimum=1), "take, delivered: the transfer (its give's index)"]


#: the request bodies, by their name in the OpenAPI document's components
REQUESTS: Final[dict[str, Any]] = {
    "Dst": DstBody,
    "Retry": RetryBody,
    "Schedule": Schedule,
    "JobBody": JobBody,
    "BatchJob": BatchJob,
    "Batch": Batch,
    "JobPatch": JobPatch,
    "Trigger": Trigger,
    "DlqSelection": DlqBulkBody,
    "LoginCodeRequest": LoginCodeBody,
    "Login": LoginBody,
    "NodeBody": NodeBody,
    "JoinBody": JoinBody,
    "CapsBody": CapsBody,
}
