"""Decoding a Raft entry never raises: what does not decode becomes an ``Undecodable`` whose
reason ``apply`` returns as the rejection ("undecodable command: <reason>"), so the reason must
say what is wrong (a new command type from a newer node, a missing argument, ...)."""

from __future__ import annotations

import orjson
import pytest

from schedd.core import commands


def entry(*cmds: object) -> bytes:
    return orjson.dumps({"v": 1, "c": list(cmds)})


WHOLE_ENTRY: list[tuple[bytes, str]] = [
    (b"{not json", "entry is not valid JSON"),
    (b"", "entry is not valid JSON"),
    (b'{"v":2,"c":[]}', "unsupported entry (version 2, expected 1)"),
    (b'{"c":[]}', "unsupported entry (version None, expected 1)"),
    (b'{"v":1,"c":{}}', "unsupported entry (version 1, expected 1)"),
    (b"[1]", "unsupported entry (version None, expected 1)"),
]


@pytest.mark.parametrize(("blob", "reason"), WHOLE_ENTRY, ids=[w[0].decode() for w in WHOLE_ENTRY])
def test_an_entry_that_does_not_decode_is_one_undecodable(blob: bytes, reason: str) -> None:
    assert commands.decode_entry(blob) == [commands.Undecodable(reason)]


ONE_COMMAND: list[tuple[object, str]] = [
    (5, "a command must be an object"),
    (["t", "barrier"], "a command must be an object"),
    ({"t": "reboot", "rid": "r1", "now": 1}, "unknown command type 'reboot'"),
    ({"rid": "r1", "now": 1}, "unknown command type None"),
    ({"t": 7, "rid": "r1", "now": 1}, "unknown command type 7"),
    ({"t": ["barrier"], "rid": "r1", "now": 1}, "unknown command type ['barrier']"),
    ({"t": "barrier", "rid": "r1", "now": "soon"}, "malformed Barrier: rid and now are required"),
    ({"t": "barrier", "rid": 5, "now": 1}, "malformed Barrier: rid and now are required"),
    ({"t": "barrier", "rid": None, "now": None}, "malformed Barrier: rid and now are required"),
]


@pytest.mark.parametrize(("cmd", "reason"), ONE_COMMAND, ids=[repr(o[0]) for o in ONE_COMMAND])
def test_a_command_that_does_not_decode_says_why(cmd: object, reason: str) -> None:
    assert commands.decode_entry(entry(cmd)) == [commands.Undecodable(reason)]


@pytest.mark.parametrize(
    ("cmd", "name", "words"),
    [
        ({"t": "cancel_job", "rid": "r1", "now": 1}, "CancelJob", "job_id"),  # missing argument
        ({"t": "barrier", "rid": "r1", "now": 1, "extra": 1}, "Barrier", "extra"),  # unknown one
        ({"t": "fire", "rid": "r1", "now": 1, "lf": 1, "run_ids": 5}, "Fire", "int"),
        ({"t": "submit", "rid": "r1", "now": 1, "jobs": [["J1", {"v": 9}]]}, "Submit", "v=1"),
    ],
    ids=["missing", "unknown", "fire-run-ids", "submit-spec"],
)
def test_a_malformed_command_names_its_type_and_the_problem(
    cmd: object, name: str, words: str
) -> None:
    [bad] = commands.decode_entry(entry(cmd))
    assert isinstance(bad, commands.Undecodable)
    assert bad.reason.startswith(f"malformed {name}: ")
    assert words in bad.reason


def test_one_bad_command_does_not_spoil_the_others_in_its_entry() -> None:
    decoded = commands.decode_entry(
        entry({"t": "barrier", "rid": "a", "now": 1}, 5, {"t": "barrier", "rid": "b", "now": 2})
    )
    assert decoded == [
        commands.Barrier("a", 1),
        commands.Undecodable("a command must be an object"),
        commands.Barrier("b", 2),
    ]
