"""Every operation of the HTTP surface, declared once: its id, method, path, the action its
caller's role must be allowed (``schedd.auth.ACTIONS``; None: no token needed), its summary, its
query parameters with their limits, its request body, its replies and the errors it may answer.

The routes and their role checks (``schedd/api/app.py``), the parsing of the integer query
parameters (``common.int_param`` reads the bounds declared here), the OpenAPI document
(``schedd/api/openapi.py`` renders this table; the bodies' schemas come from
``schedd.api.bodies`` and ``schedd.api.views``) and the test of every operation's role matrix
are all made from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final

from schedd.api.bodies import DURATION_PATTERN, Ident, Text, Time
from schedd.api.ports import PREFIX
from schedd.api.schema import js, values
from schedd.core.events import KINDS, MAX_INDEX
from schedd.core.model import Direction, DstGap, DstRepeat, JobSort, JobStatus, RunState
from schedd.protocol.signed import LINK_PATH
from schedd.protocol.timing import CONNECT_PATH
from schedd.storage.reader import MAX_IDS, SCAN_WINDOW
from schedd.storage.schema import FIRST


@dataclass(frozen=True, slots=True)
class IntQuery:
    """An integer query parameter from ``lo`` to ``hi`` (``default`` when absent)."""

    name: str
    default: int | None
    lo: int
    hi: int
    description: str

    @property
    def type(self) -> Any:
        keywords = {"minimum": self.lo, "maximum": self.hi}
        if self.default is not None:
            keywords["default"] = self.default
        return Annotated[int, js(**keywords)]


@dataclass(frozen=True, slots=True)
class Query:
    """A query parameter of another type (an annotation, see ``schedd.api.schema``)."""

    name: str
    type: Any
    description: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful answer: its status, what it means, and its body (a component of the
    document, by name; None: no body; ``media`` other than JSON: a text or binary body), and
    the headers it always carries (besides ``Content-Type``)."""

    status: int
    description: str
    body: str | None = None
    media: str = "application/json"
    headers: tuple[Query, ...] = ()


@dataclass(frozen=True, slots=True)
class Operation:
    op_id: str  # also the name of its handler
    method: str
    path: str  # an aiohttp and OpenAPI path template
    action: str | None  # what the caller's role must be allowed; None: public
    summary: str
    replies: tuple[Reply, ...] = ()
    errors: tuple[int, ...] = ()  # besides 401/403, which follow from the action
    query: tuple[IntQuery | Query, ...] = ()
    body: str | None = None  # the request body's component
    body_required: bool = True
    description: str | None = None
    write: bool = False  # a committed write: takes X-Request-Id, may answer 400/429/503
    headers: tuple[Query, ...] = ()  # request headers it reads (besides X-Request-Id)
    #: a read of the replicated state: takes min_index and consistency, may answer 400/503
    #: (schedd.api.consistency)
    fresh: bool = False


LIMIT: Final = IntQuery("limit", 100, 1, 1000, "page size")
CURSOR: Final = IntQuery("cursor", None, 0, FIRST, "next_cursor of the previous page")
COUNT: Final = IntQuery("count", 10, 1, 1000, "how many fire times")
PAGE: Final = (LIMIT, CURSOR)
MINUTES: Final = IntQuery("minutes", 5, 1, 60, "the window: the last this many minutes")
WRITE_ERRORS: Final = (400, 429, 503)  # X-Request-Id, Raft queue full, no leader

FROM: Final = Query(
    "from",
    Time,
    "the fire times after this instant (1970 to 2199) instead of after now (an every "
    "expression is counted from it)",
)
_JOB = Reply(200, "the job", "Job")
_RUN = Reply(200, "the run", "Run")
_DONE = Reply(204, "done; no body")
Duration = Annotated[str, js(pattern=DURATION_PATTERN)]
_KINDS = "|".join(KINDS)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "submit_job",
        "POST",
        f"{PREFIX}/jobs",
        "submit",
        "Submit a job",
        (
            Reply(201, "created", "Job"),
            Reply(
                200,
                "the existing job: its idempotency_key was seen before (or the X-Request-Id "
                "repeated)",
                "Job",
            ),
        ),
        (404, 409, 413),
        body="JobBody",
        description="404 when depends_on names an unknown job.",
        write=True,
    ),
    Operation(
        "list_jobs",
        "GET",
        f"{PREFIX}/jobs",
        "read",
        "List jobs",
        (Reply(200, "a page", "JobList"),),
        (400,),
        query=(
            Query("namespace", Ident, "only this namespace"),
            Query("queue", Ident, "only this queue"),
            Query("status", Annotated[str, values(JobStatus)], "only jobs in this status"),
            Query("task", str, "only this task"),
            Query("name", str, "only jobs of this name"),
            Query(
                "id_prefix",
                Annotated[str, js(pattern="^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{1,26}$")],
                "only jobs whose id starts so (either case)",
            ),
            Query(
                "ids",
                Annotated[
                    str,
                    js(
                        pattern=f"^[0-9A-HJKMNP-TV-Z]{{26}}(,[0-9A-HJKMNP-TV-Z]{{26}}){{0,{MAX_IDS - 1}}}$"
                    ),
                ],
                f"only these jobs: up to {MAX_IDS} ids, comma-separated (those that do not exist "
                "are left out)",
            ),
            Query(
                "last_run",
                Annotated[str, values(RunState)],
                f"only jobs whose latest run is in this state (at most {SCAN_WINDOW:,} jobs are "
                "read for a page: a page may hold fewer jobs than asked, or none, and still have "
                "a next_cursor)",
            ),
            Query(
                "sort",
                Annotated[str, values(JobSort), js(default=JobSort.CREATED.value)],
                "the order: created (when the job was added; newest first by default), "
                "next_fire (its next fire time; soonest first, jobs with none last) or "
                "latest_run (its latest run's scheduled time; newest first, jobs never run "
                "last). Ties go in the order jobs were added. Sorted by a time, a page with a "
                f"filter other than name, id_prefix or ids reads at most {SCAN_WINDOW:,} jobs",
            ),
            Query(
                "order",
                Annotated[str, values(Direction)],
                "asc or desc (default: the sort's own, desc for created and latest_run, asc for "
                "next_fire)",
            ),
            LIMIT,
            Query(
                "cursor",
                Annotated[str, js(pattern=r"^[0-9]{1,19}(\.[0-9]{1,19})?$")],
                "next_cursor of the previous page, with the same sort and order",
            ),
        ),
        fresh=True,
    ),
    Operation(
        "submit_batch",
        "POST",
        f"{PREFIX}/jobs/batch",
        "submit",
        "Submit jobs at once, all or nothing",
        (
            Reply(
                201,
                "created (jobs whose idempotency_key repeats are the existing ones)",
                "BatchResult",
            ),
        ),
        (404, 409, 413),
        body="Batch",
        description="Items may name each other by ref in depends_on; a cycle is a 409. A batch "
        "larger than the namespace's burst is a 429 without Retry-After: split it.",
        write=True,
    ),
    Operation(
        "get_job",
        "GET",
        f"{PREFIX}/jobs/{{job_id}}",
        "read",
        "One job",
        (_JOB,),
        (404,),
        fresh=True,
    ),
    Operation(
        "update_job",
        "PATCH",
        f"{PREFIX}/jobs/{{job_id}}",
        "submit",
        "Change a job",
        (_JOB,),
        (404, 409, 413),
        body="JobPatch",
        write=True,
    ),
    Operation(
        "cancel_job",
        "DELETE",
        f"{PREFIX}/jobs/{{job_id}}",
        "submit",
        "Cancel a job and its unfinished runs",
        (_DONE,),
        (404,),
        description="Running runs are told to stop. Cancelling a cancelled or finished job is a "
        "no-op (204).",
        write=True,
    ),
    Operation(
        "trigger_job",
        "POST",
        f"{PREFIX}/jobs/{{job_id}}/trigger",
        "submit",
        "Run a job now",
        (Reply(201, "the new run (skipped when the overlap policy says so)", "Run"),),
        (404, 409, 413),
        body="Trigger",
        body_required=False,
        description="409 when the job is cancelled.",
        write=True,
    ),
    Operation(
        "job_runs",
        "GET",
        f"{PREFIX}/jobs/{{job_id}}/runs",
        "read",
        "A job's runs, newest first, with their attempts",
        (Reply(200, "a page of runs", "RunList"),),
        (400, 404),
        query=(
            Query("state", Annotated[str, values(RunState)], "only runs in this state"),
            Query("since", Time, "only runs scheduled at or after this time"),
            *PAGE,
        ),
        fresh=True,
    ),
    Operation(
        "explain_job",
        "GET",
        f"{PREFIX}/jobs/{{job_id}}/explain",
        "read",
        "A job's next fire times",
        (Reply(200, "the next fire times (one or none for a one-off job)", "Explain"),),
        (400, 404),
        query=(FROM, COUNT),
        fresh=True,
    ),
    Operation(
        "explain_expr",
        "GET",
        f"{PREFIX}/explain",
        "read",
        "The next fire times of a schedule expression",
        (Reply(200, "the next fire times", "Explain"),),
        (400,),
        query=(
            Query("cron", str, "a cron expression (this or every is required)"),
            Query("every", Duration, "an interval (this or cron is required)"),
            Query("timezone", str, "an IANA zone; default UTC"),
            Query("jitter", Duration, "a jitter duration"),
            Query("dst_gap", Annotated[str, values(DstGap)], "what to do in a DST gap"),
            Query("dst_repeat", Annotated[str, values(DstRepeat)], "what to do in a DST repeat"),
            FROM,
            COUNT,
        ),
    ),
    Operation(
        "get_run",
        "GET",
        f"{PREFIX}/runs/{{run_id}}",
        "read",
        "One run",
        (_RUN,),
        (404,),
        fresh=True,
    ),
    Operation(
        "cancel_run",
        "POST",
        f"{PREFIX}/runs/{{run_id}}/cancel",
        "submit",
        "Cancel a run",
        (_RUN,),
        (404, 409),
        description="A running run is told to stop; cancelling a finished run is a no-op (200).",
        write=True,
    ),
    Operation(
        "list_dlq",
        "GET",
        f"{PREFIX}/dlq",
        "read",
        "The dead-letter queue, newest first",
        (Reply(200, "a page of failed runs", "RunList"),),
        (400,),
        query=(
            Query("namespace", Ident, "only this namespace"),
            Query("queue", Ident, "only runs of jobs on this queue"),
            Query("task", str, "only runs of this task"),
            Query("since", Time, "only runs that failed at or after this time"),
            Query("error", Text, "only runs whose error contains this text (either case)"),
            *PAGE,
        ),
        description=f"With a filter at most {SCAN_WINDOW:,} positions of the queue are read for "
        "a page: a page may hold fewer runs than asked, or none, and still have a next_cursor.",
        fresh=True,
    ),
    Operation(
        "replay_dead",
        "POST",
        f"{PREFIX}/dlq/{{run_id}}/replay",
        "submit",
        "Run a dead-lettered run again",
        (_RUN,),
        (404, 409),
        write=True,
    ),
    Operation(
        "drop_dead",
        "DELETE",
        f"{PREFIX}/dlq/{{run_id}}",
        "submit",
        "Drop a run from the dead-letter queue",
        (_DONE,),
        (404,),
        write=True,
    ),
    *(
        Operation(
            f"{action}_dead_letters",
            "POST",
            f"{PREFIX}/dlq/{action}",
            "submit",
            f"{action.capitalize()} the runs of the dead-letter queue that match a filter, or "
            "a list of runs, at once",
            (Reply(200, f"what was {done} (dry_run: what would be)", "DlqBulkResult"),),
            (413,),
            body="DlqSelection",
            description="One Raft entry: every node acts on the same runs, all or none. The "
            "node resolves the filter to the runs it reads (as GET /dlq shows them there) and "
            "commits their list. More runs matching than limits.max_bulk (default 10000) is a "
            "400 naming the limit: narrow the filter. A repeated X-Request-Id gets the first "
            "answer and does nothing again.",
            write=True,
        )
        for action, done in (("replay", "replayed"), ("drop", "dropped"))
    ),
    Operation(
        "cluster",
        "GET",
        f"{PREFIX}/cluster",
        "read",
        "Nodes, roles, leader, term, indexes, health",
        (Reply(200, "this node's view", "Cluster"),),
    ),
    Operation(
        "cluster_nodes",
        "GET",
        f"{PREFIX}/cluster/nodes",
        "read",
        "The members: voters and the learner being added, with what this node sees of each",
        (Reply(200, "the membership", "Members"),),
        description="Any node answers from the membership it applied (source log: recorded by "
        "a change; config: no change yet, the nodes' raft.peers). match_index and lag only "
        "when this node leads.",
        fresh=True,
    ),
    Operation(
        "add_node",
        "POST",
        f"{PREFIX}/cluster/nodes",
        "admin",
        "Add a node: it joins as a learner, and becomes a voter once it has caught up",
        (Reply(201, "the change is committed; the new membership", "Members"),),
        (400, 409, 503),
        body="NodeBody",
        description="One change at a time: 409 while another node is still joining, when "
        "the address or id is a member already, or when a voter runs a schedd without "
        "membership changes. Start the new node (empty, with raft.peers or raft.join naming "
        "the cluster) before or after. A follower forwards the request to the leader.",
    ),
    Operation(
        "remove_node",
        "DELETE",
        f"{PREFIX}/cluster/nodes/{{node}}",
        "admin",
        "Remove a node (by id or Raft address); the leader hands its leadership over first",
        (Reply(200, "the change is committed; the new membership", "Members"),),
        (400, 404, 409, 503),
        description="400 for the last voter; 404 for a name that is not a member; 409 while "
        "another node is joining (remove that one first). The removed node stops, and is "
        "refused if it comes back with its data.",
    ),
    Operation(
        "join_cluster",
        "POST",
        f"{PREFIX}/cluster/join",
        None,
        "A new node asks to be added (raft.join); signed with the cluster's Raft secret",
        (Reply(200, "added as a learner (or already a member)", "JoinAnswer"),),
        (400, 403, 409, 503),
        body="JoinBody",
        description="No token: the request carries an HMAC-SHA256 of its fields with the "
        "Raft secret. 403 when it is not signed with this cluster's secret (or, in a cluster "
        "without one, does not come from this machine); 409 when the node holds data.",
    ),
    Operation(
        "shard_caps",
        "POST",
        f"{PREFIX}/internal/caps",
        None,
        "Between the nodes of a cluster of several shards: move the slots of the namespaces' "
        "concurrency caps between the shards' leaders; signed with the cluster's Raft secret",
        (Reply(200, "the shard leader's answer", "CapsAnswer"),),
        (400, 403, 503),
        body="CapsBody",
        description="No token: the request carries an HMAC-SHA256 of its fields with the "
        "Raft secret. Ops: view (each capped namespace's allowance, runs in flight and "
        "waiting), limit, give, take, delivered. A node that does not lead the shard asks "
        "its leader.",
    ),
    Operation(
        "shard_link",
        "GET",
        LINK_PATH,
        None,
        "Between the nodes of a cluster of several shards: a node's front door carrying the "
        "worker connections of all its workers to one shard's leader (websocket)",
        (
            Reply(
                101,
                "switching to the websocket protocol: messages of JSON lists of envelopes "
                "{w, t: hello | frame | bye | redirect, f}",
            ),
        ),
        (400, 403),
        description="No token: the upgrade carries X-Schedd-Link, the caller's clock (Unix "
        "ms) and an HMAC-SHA256 of it with the Raft secret. 400 without it (or with a clock "
        "more than 5 minutes off), 403 when it is not signed with this cluster's secret (or, "
        "in a cluster without one, does not come from this machine).",
    ),
    Operation(
        "scheduling_lag",
        "GET",
        f"{PREFIX}/scheduling-lag",
        "read",
        "How late runs fire and start: p50/p99 over the last minutes by queue and priority, "
        "and what is due but not leased now",
        (Reply(200, "the leader's figures", "SchedulingLag"),),
        (400, 503),
        query=(
            MINUTES,
            Query(
                "samples",
                Annotated[bool, js(default=False)],
                "true: also each run's lag in the window, one by one (the last 15 minutes at "
                "most, the newest 5000 of each lag)",
            ),
        ),
        description="From the leader's schedd_fire_lag_seconds and schedd_lease_lag_seconds "
        "observations (the same values, kept per 10 s for an hour, and one by one for 15 "
        "minutes; quantiles interpolated in the histograms' buckets, as Prometheus does); a new "
        "leader starts without. A follower asks the leader (503 when none is known or "
        "reachable).",
    ),
    Operation(
        "workers",
        "GET",
        f"{PREFIX}/workers",
        "read",
        "Connected workers",
        (Reply(200, "the leader's workers", "Workers"),),
        (503,),
        description="Answered by the leader (a follower asks it); 503 when no leader is known or "
        "reachable.",
    ),
    Operation(
        "drain_worker",
        "POST",
        f"{PREFIX}/workers/{{worker_id}}/drain",
        "admin",
        "Drain a worker: it finishes the leases it holds and is leased nothing more",
        (Reply(200, "the worker, draining", "Worker"),),
        (404, 503),
        description="The leader sends the worker a drain frame (the SDK says it again to a new "
        "leader after a failover); GET /workers shows it draining. A follower asks the leader; "
        "503 when none is known or reachable, 404 when the worker is not connected to it.",
    ),
    Operation(
        "worker_connect",
        "GET",
        CONNECT_PATH,
        "worker",
        "The worker protocol (websocket)",
        (
            Reply(
                101,
                "switching to the websocket protocol: text frames, one JSON object each, with a "
                "type (hello, welcome, lease, heartbeat, complete, fail, ack, cancel, drain, "
                "redirect, error)",
            ),
        ),
        (400,),
        description="400 for a request that is not a websocket upgrade.",
    ),
    Operation(
        "events",
        "GET",
        f"{PREFIX}/events",
        "read",
        "Changes of jobs, runs, the dead-letter queue and the leader, as server-sent events",
        (
            Reply(
                200,
                "a text/event-stream: a hello event first (StreamStart), then events job, run, "
                "dlq and cluster whose data is a JSON array of changes (JobChange, RunChange, "
                "DlqChange, ClusterChange), reset (StreamStart) when the client missed changes "
                "and must read its pages again, and a comment every 15 s. An event's id is the "
                "Raft index it covers up to (with several shards, a stamp that compares across them), the "
                "same on every node: resume with Last-Event-ID on this node or another.",
                "EventStream",
                "text/event-stream",
            ),
        ),
        (400,),
        query=(
            Query(
                "types",
                Annotated[str, js(pattern=f"^({_KINDS})(,({_KINDS}))*$")],
                f"only these kinds of change, comma-separated ({', '.join(KINDS)}); default all",
            ),
            Query(
                "job_id",
                Annotated[str, js(minLength=1, maxLength=200)],
                "only the changes of this job and its runs (and cluster changes)",
            ),
            Query("namespace", Ident, "only this namespace's changes (and cluster changes)"),
            Query(
                "last_event_id",
                Annotated[int, js(minimum=0, maximum=MAX_INDEX)],
                "resume after this event id (for clients that cannot send Last-Event-ID)",
            ),
            Query(
                "follow",
                Annotated[bool, js(default=True)],
                "false: send what this node holds after the position and end the stream",
            ),
        ),
        headers=(
            Query(
                "Last-Event-ID",
                Annotated[str, js(pattern="^[0-9]{0,19}$")],
                "resume after this event id (the id of the last event the client got, here or "
                "on another node); ahead of last_event_id",
            ),
        ),
        description="A new client opens the stream first, then reads its pages: the hello "
        "event's id is what those pages show, and the changes after it follow. Each stream "
        "writes at most every 0.1 s, each record once with its latest state.",
    ),
    Operation(
        "snapshot",
        "GET",
        f"{PREFIX}/snapshot",
        "admin",
        "A consistent image of this node's state, for a backup (schedctl snapshot save)",
        (
            Reply(
                200,
                "the image, streamed as it is read (chunked): a header, the state database "
                "and its write-ahead log in checksummed frames, and the SHA-256 of it all",
                "Snapshot",
                "application/octet-stream",
                headers=(
                    Query(
                        "X-Schedd-Applied-Index",
                        Annotated[str, js(pattern="^[0-9]{1,19}$")],
                        "the Raft log index the image holds every entry up to",
                    ),
                    Query(
                        "Content-Disposition",
                        Annotated[str, js(pattern="^attachment; filename=")],
                        'attachment; filename="schedd-<node>-<applied index>.snap"',
                    ),
                ),
            ),
        ),
        (429, 503),
        description="Any node answers with its own state, consistent at the index it has "
        "applied (a follower's may trail the leader's by a moment). The image is read from "
        "one read transaction while the node goes on working; nothing is written on the node, "
        "and it is sent at raft.snapshot_rate (default 32 MiB/s). One image streams from a "
        "node at a time: 429 with Retry-After while another does. A client that reads nothing "
        "for 60 s is dropped. 503 when the state cannot be read now (the node is installing "
        "a copy from the leader, or stopping).",
    ),
    Operation(
        "whoami",
        "GET",
        f"{PREFIX}/whoami",
        "read",
        "The caller's token: its name, role, and the actions and operations it may do",
        (Reply(200, "the token", "Whoami"),),
        description="For a page that hides what its user may not do; any role may ask.",
    ),
    Operation(
        "create_login_code",
        "POST",
        f"{PREFIX}/login/codes",
        "read",
        "A one-time code that opens a dashboard session on this node (schedctl ui)",
        (Reply(201, "the code", "LoginCode"),),
        (400, 403),
        body="LoginCodeRequest",
        body_required=False,
        description="Any role may ask, with a token of the tokens file (a dashboard session "
        "may not: 403). The code stands for the caller's token (or, with read_only, for its "
        "read role); it is good once, for 60 s, on this node: open path there. It is kept in "
        "this node's memory only.",
    ),
    Operation(
        "login",
        "POST",
        f"{PREFIX}/login",
        None,
        "Exchange a one-time code for a dashboard session token",
        (Reply(200, "the session", "Session"),),
        (400, 401),
        body="Login",
        description="No token needed: the code is the credential, used up by this call (401 "
        "when it is unknown, used or expired). The session token is a bearer token of the "
        "code's role until expires_at (auth.ui_session_ttl, default 8 h), taken by every node "
        "that has the same token in its tokens file; changing or removing that token ends "
        "its sessions.",
    ),
    Operation(
        "openapi_json",
        "GET",
        f"{PREFIX}/openapi.json",
        None,
        "This document (no token needed: it describes the API, and holds nothing of the cluster's)",
        (Reply(200, "the OpenAPI 3.1 description of the API", "OpenApi"),),
    ),
    Operation(
        "metrics",
        "GET",
        "/metrics",
        "read",
        "Prometheus metrics",
        (Reply(200, "the Prometheus text exposition format", "Text", "text/plain"),),
    ),
    Operation(
        "healthz", "GET", "/healthz", None, "Liveness", (Reply(200, "the process is up", "Health"),)
    ),
    Operation(
        "readyz",
        "GET",
        "/readyz",
        None,
        "Readiness: a member of a cluster with a known leader",
        (Reply(200, "ready", "Ready"),),
        (503,),
    ),
)

BY_ID: dict[str, Operation] = {op.op_id: op for op in OPERATIONS}

#: paths anyone may call without a token
PUBLIC_PATHS: frozenset[str] = frozenset(op.path for op in OPERATIONS if op.action is None)
