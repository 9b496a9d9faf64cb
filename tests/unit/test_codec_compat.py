"""Frozen samples of codec version 1 (entries already in journals must keep decoding the same)
and of a run's stored body from before attempts kept progress and tracebacks."""

from __future__ import annotations

from schedd.core import commands
from schedd.core.model import (
    Attempt,
    AttemptOutcome,
    JobSpec,
    Priority,
    Run,
    RunState,
    evolve,
)
from schedd.storage import codec

T0 = 1_800_000_000_000

FROZEN_V1 = (
    b'{"v":1,"c":[{"t":"claim","rid":"a","now":1800000000000,"node":"n1","term":3,"http":"http://h"},'
    b'{"t":"submit","rid":"b","now":1800000000000,"jobs":[["J1",{"v":1,"task":"t","prio":"high"}]]},'
    b'{"t":"fire","rid":"c","now":1800000000001,"lf":7,"run_ids":["J1@1800000000000"]},'
    b'{"t":"lease","rid":"d","now":1800000000002,"lf":7,"grants":[["J1@1800000000000","w1"]]},'
    b'{"t":"complete","rid":"e","now":1800000000003,"lf":7,"run_id":"J1@1800000000000","fence":9,"result":{"ok":true}},'
    b'{"t":"fail","rid":"f","now":1800000000004,"lf":7,"run_id":"J1@1800000000000","fence":9,"error":"x","retryable":false,"outcome":"lost","rand":0.25},'
    b'{"t":"cancel_job","rid":"g","now":1800000000005,"job_id":"J1"},'
    b'{"t":"barrier","rid":"h","now":1800000000006}]}'
)


def test_frozen_v1_sample_decodes() -> None:
    cmds = commands.decode_entry(FROZEN_V1)
    assert cmds == [
        commands.Claim("a", 1800000000000, "n1", 3, "http://h"),
        commands.Submit("b", 1800000000000, (("J1", JobSpec(task="t", priority=Priority.HIGH)),)),
        commands.Fire("c", 1800000000001, 7, ("J1@1800000000000",)),
        commands.LeaseRuns("d", 1800000000002, 7, (("J1@1800000000000", "w1"),)),
        commands.CompleteRun("e", 1800000000003, 7, "J1@1800000000000", 9, {"ok": True}),
        commands.FailRun(
            "f", 1800000000004, 7, "J1@1800000000000", 9, "x", False, AttemptOutcome.LOST, 0.25
        ),
        commands.CancelJob("g", 1800000000005, "J1"),
        commands.Barrier("h", 1800000000006),
    ]


def test_unknown_version_is_rejected_not_misread() -> None:
    [bad] = commands.decode_entry(FROZEN_V1.replace(b'"v":1', b'"v":2', 1))
    assert isinstance(bad, commands.Undecodable) and "version" in bad.reason


def _one(cmd: bytes) -> bytes:
    return b'{"v":1,"c":[' + cmd + b"]}"


FROZEN_COMPLETE = (
    b'{"t":"complete","rid":"e","now":1800000000003,"lf":7,"run_id":"J1@1800000000000",'
    b'"fence":9,"result":{"ok":true}}'
)
FROZEN_FAIL = (
    b'{"t":"fail","rid":"f","now":1800000000004,"lf":7,"run_id":"J1@1800000000000","fence":9,'
    b'"error":"x","retryable":false,"outcome":"lost","rand":0.25}'
)


def test_a_result_without_progress_or_traceback_is_written_exactly_as_before() -> None:
    [complete] = commands.decode_entry(_one(FROZEN_COMPLETE))
    [fail] = commands.decode_entry(_one(FROZEN_FAIL))
    assert isinstance(complete, commands.CompleteRun) and complete.progress is None
    assert isinstance(fail, commands.FailRun) and (fail.traceback, fail.progress) == (None, None)
    assert commands.encode_entry([complete]) == _one(FROZEN_COMPLETE)
    assert commands.encode_entry([fail]) == _one(FROZEN_FAIL)


def test_progress_and_tracebacks_round_trip_in_entries() -> None:
    cmds: list[commands.Command] = [
        commands.CompleteRun("e", 1, 7, "J1@1", 9, None, {"done": [1, 2]}),
        commands.FailRun(
            "f", 2, 7, "J1@1", 9, "ValueError: x", True, AttemptOutcome.FAILED, 0.5, "tb\n…", 0.5
        ),
        commands.Progress("p", 3, 7, (("J1@1", 9, {"pct": 50}), ("J2@1", 11, "half"))),
    ]
    assert commands.decode_entry(commands.encode_entry(cmds)) == cmds


# A run's body as written before attempts kept progress and tracebacks (8 fields an attempt).
FROZEN_RUN_BODY = (
    b'{"ns":"default","d":1800000000000,"st":"retrying","c":1800000000000,"u":1800000000005,'
    b'"at":[[1,9,"w1",1800000000000,null,1800000000005,"failed","boom"]],"e":"boom"}'
)


def test_a_run_body_written_before_progress_and_tracebacks_reads_without_them() -> None:
    run = codec.run_from_body("J1", T0, FROZEN_RUN_BODY)
    assert run.attempts == (
        Attempt(1, 9, "w1", T0, None, T0 + 5, AttemptOutcome.FAILED, "boom", None, None, None),
    )
    assert codec.run_body(run) == FROZEN_RUN_BODY  # and is written back the same


def test_an_attempt_with_progress_and_a_traceback_reads_back_as_written() -> None:
    attempt = Attempt(
        1, 9, "w1", T0, None, T0 + 5, AttemptOutcome.FAILED, "boom", {"n": 3}, T0 + 2, "tb"
    )
    run = Run(f"J1@{T0}", "J1", "default", T0, T0, RunState.RETRYING, T0, T0 + 5, (attempt,))
    assert codec.run_from_body("J1", T0, codec.run_body(run)) == run
    for only in ({"progress_ms": T0}, {"traceback": "tb"}, {"progress": 0}):
        one = Attempt(2, 11, "w1", T0, **only)  # type: ignore[arg-type]
        assert codec.run_from_body(
            "J1", T0, codec.run_body(evolve(run, attempts=(one,)))
        ).attempts == (one,)
