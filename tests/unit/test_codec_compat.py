"""A frozen sample of codec version 1: entries already in journals must keep decoding the same."""

from __future__ import annotations

from schedd.core import commands
from schedd.core.model import AttemptOutcome, JobSpec, Priority

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
