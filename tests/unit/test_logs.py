"""schedd.logs: JSON and text event lines, auto format, fields, exceptions, redaction."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import orjson
import pytest

from schedd.logs import log_event, parse_level, set_level, setup_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_json_lines(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("debug", "json", stream=out)
    log = logging.getLogger("schedd.test")
    log_event(log, "lease.granted", run_id="j1@1000", fence=7, ok=True, extra_data={"a": [1]})
    log.info("plain %s message", "old-style")
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert TS.match(first.pop("ts"))
    assert first == {
        "level": "info",
        "logger": "schedd.test",
        "event": "lease.granted",
        "run_id": "j1@1000",
        "fence": 7,
        "ok": True,
        "extra_data": {"a": [1]},
    }
    assert lines[1]["event"] == "plain old-style message"


def test_text_lines(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("info", "text", stream=out)
    log_event(
        "schedd.raft",
        "leader_elected",
        logging.WARNING,
        term=7,
        leader="n2",
        note="two words",
        none=None,
    )
    line = out.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    ts, rest = line.rstrip("\n").split(" ", 1)
    assert TS.match(ts)
    assert rest == 'WARNING schedd.raft leader_elected term=7 leader=n2 note="two words" none=null'


def test_level_filters_and_set_level(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("warning", "text", stream=out)
    log_event("schedd.x", "quiet", logging.INFO)
    assert out.getvalue() == ""
    set_level("debug")
    log_event("schedd.x", "loud", logging.DEBUG)
    assert " DEBUG schedd.x loud" in out.getvalue()


def test_exception_is_one_field(restore_root: None) -> None:
    for fmt in ("json", "text"):
        out = io.StringIO()
        setup_logging("info", fmt, stream=out)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("schedd.x").exception("apply.failed", extra={"fields": {"index": 3}})
            log_event("schedd.x", "apply.failed2", logging.ERROR, exc_info=True)
        lines = out.getvalue().splitlines()
        assert len(lines) == 2, lines  # one line per event, traceback included
        if fmt == "json":
            body = orjson.loads(lines[0])
            assert body["index"] == 3
            assert "RuntimeError: boom" in body["exc"] and "Traceback" in body["exc"]
        else:
            assert " index=3 exc=" in lines[0] and "RuntimeError: boom" in lines[0]


def test_secret_fields_are_redacted(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    log_event(
        "schedd.x",
        "tokens",
        secret="s3cr3t-value",
        raft_secret="x",
        authorization="Bearer y",
        token_name="ops",
    )
    body = orjson.loads(out.getvalue())
    assert body["secret"] == body["raft_secret"] == body["authorization"] == "[redacted]"
    assert body["token_name"] == "ops"
    assert "s3cr3t" not in out.getvalue()


def test_reserved_field_names_do_not_clobber(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    log_event("schedd.x", "e", level=logging.INFO, logger_name="a", **{"event_id": 1})
    logging.getLogger("schedd.x").info("e2", extra={"fields": {"event": "x", "ts": 1}})
    second = orjson.loads(out.getvalue().splitlines()[1])
    assert second["event"] == "e2" and second["field_event"] == "x" and second["field_ts"] == 1


def test_unserializable_values_become_strings(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    log_event("schedd.x", "e", path=__import__("pathlib").Path("/tmp/x"), s={1})
    body = orjson.loads(out.getvalue())
    assert body["path"] == "/tmp/x"


def test_auto_format(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("info", "auto", stream=out, env={"JOURNAL_STREAM": "8:1234"})
    log_event("schedd.x", "under-systemd")
    assert orjson.loads(out.getvalue())["event"] == "under-systemd"
    out2 = io.StringIO()
    setup_logging("info", "auto", stream=out2, env={})
    log_event("schedd.x", "on-a-terminal")
    assert " INFO schedd.x on-a-terminal" in out2.getvalue()
    assert out.getvalue().count("\n") == 1  # the first handler was replaced, not stacked


def test_setup_is_idempotent(restore_root: None) -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    setup_logging("info", "text", stream=io.StringIO())
    setup_logging("debug", "json", stream=io.StringIO())
    assert len(root.handlers) == before + 1
    assert root.level == logging.DEBUG


def test_bad_level_and_format() -> None:
    assert parse_level("WARN") == logging.WARNING
    with pytest.raises(ValueError, match="unknown log level"):
        parse_level("loud")
    with pytest.raises(ValueError, match="unknown log format"):
        setup_logging("info", "xml", stream=io.StringIO())
