"""Response schemas derived from the views' TypedDicts (schedd.api.schema): what each kind of
annotation becomes, and that what the views really build is valid against what is published."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict, get_type_hints

import orjson
import pytest

from schedd.api.openapi import spec
from schedd.api.schema import Components, js
from schedd.api.views import job_view, run_view
from schedd.core.model import (
    Attempt,
    AttemptOutcome,
    Job,
    JobSpec,
    JobStatus,
    RecurringOptions,
    Run,
    RunState,
    Schedule,
    ScheduleKind,
)

T0 = 1_795_572_000_000


class Inner(TypedDict):
    """An inner object."""

    n: Annotated[int, js(minimum=1), "a count"]


class Outer(TypedDict):
    name: str | None
    state: RunState | None
    size: int | float
    kind: Literal["a", "b"]
    ok: Literal["ok"]
    inner: Inner | None
    inners: list[Inner]
    either: Inner | Outer2
    anything: Any
    maybe: NotRequired[bool]


class Outer2(TypedDict):
    x: bool


def test_each_kind_of_annotation_becomes_its_schema() -> None:
    schemas = Components({"Outer": Outer, "Inner": Inner}).schemas()
    inner, outer = schemas["Inner"], schemas["Outer"]
    assert inner == {
        "type": "object",
        "required": ["n"],
        "properties": {"n": {"type": "integer", "minimum": 1, "description": "a count"}},
        "additionalProperties": False,
        "description": "An inner object.",
    }
    props = outer["properties"]
    assert outer["required"] == [k for k in props if k != "maybe"]
    assert outer["additionalProperties"] is False
    assert props["name"] == {"type": ["string", "null"]}
    assert props["state"] == {
        "type": ["string", "null"],
        "enum": [*(s.value for s in RunState), None],
    }
    assert props["size"] == {"type": "number"}
    assert props["kind"] == {"type": "string", "enum": ["a", "b"]}
    assert props["ok"] == {"const": "ok"}
    ref = {"$ref": "#/components/schemas/Inner"}
    assert props["inner"] == {"anyOf": [ref, {"type": "null"}]}
    assert props["inners"] == {"type": "array", "items": ref}
    assert props["either"]["oneOf"][0] == ref  # Outer2 is not named: inline
    assert props["either"]["oneOf"][1]["properties"] == {"x": {"type": "boolean"}}
    assert props["anything"] == {}
    assert props["maybe"] == {"type": "boolean"}


def test_a_type_without_a_json_form_is_refused() -> None:
    class Bad(TypedDict):
        when: bytes

    with pytest.raises(TypeError, match="no JSON schema"):
        Components({"Bad": Bad}).schemas()


def _job(schedule: Schedule) -> Job:
    spec_ = JobSpec(task="t", schedule=schedule, payload={"k": [1]}, timeout_ms=1500)
    return Job("J1", spec_, JobStatus.ACTIVE, T0, T0, next_run_at_ms=T0 + 1000)


def _run() -> Run:
    attempts = (
        Attempt(1, 7, "w1", T0, None, T0 + 5, AttemptOutcome.FAILED, "boom"),
        Attempt(2, 9, "w1", T0 + 10, T0 + 1010),
    )
    return Run("J1@1", "J1", "default", T0, T0, RunState.RUNNING, T0, T0 + 10, attempts)


SCHEDULES = {
    "now": Schedule(),
    "at": Schedule(kind=ScheduleKind.AT, at_ms=T0),
    "in": Schedule(kind=ScheduleKind.IN, in_ms=90_000, at_ms=T0),
    "every": Schedule(kind=ScheduleKind.EVERY, every_ms=1500, options=RecurringOptions()),
    "cron": Schedule(kind=ScheduleKind.CRON, cron="0 9 * * *", timezone="Europe/Berlin"),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_what_the_views_build_is_valid_against_the_published_schemas(kind: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = spec()

    def check(name: str, value: Any) -> None:
        root = {"components": doc["components"], "$ref": f"#/components/schemas/{name}"}
        validator = jsonschema.Draft202012Validator(
            root, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        errors = [e.message for e in validator.iter_errors(orjson.loads(orjson.dumps(value)))]
        assert errors == []

    check("Job", job_view(_job(SCHEDULES[kind]), _run()))
    check("Run", run_view(_run()))
    wrong = orjson.loads(orjson.dumps(job_view(_job(SCHEDULES[kind]), None)))
    wrong["status"] = "sleeping"
    root = {"components": doc["components"], "$ref": "#/components/schemas/Job"}
    assert not jsonschema.Draft202012Validator(root).is_valid(wrong)


def test_the_request_bodies_declare_exactly_the_fields_the_validator_takes() -> None:
    from schedd.api import bodies
    from schedd.core import validate

    def keys(tp: Any) -> set[str]:
        return set(get_type_hints(tp))

    assert keys(bodies.JobBody) == set(validate.JOB_FIELDS)
    assert keys(bodies.BatchJob) == {*validate.JOB_FIELDS, "ref"}
    assert keys(bodies._JobPatch) == set(validate.PATCH_FIELDS)
    variants = (bodies.ScheduleAt, bodies.ScheduleIn, bodies.ScheduleEvery, bodies.ScheduleCron)
    assert all(keys(v) == set(validate.SCHEDULE_FIELDS) for v in variants)
    assert keys(bodies.RetryBody) == set(validate.RETRY_FIELDS)
    assert keys(bodies.DstBody) == set(validate.DST_FIELDS)
    assert keys(bodies.DlqBulkBody) == set(validate.DLQ_BULK_FIELDS)


def test_the_integer_parameters_the_handlers_read_are_the_ones_documented() -> None:
    from schedd.api.operations import BY_ID, COUNT, LIMIT

    doc = spec()["paths"]

    def param(path: str, name: str) -> dict[str, Any]:
        [p] = [p for p in doc[path]["get"]["parameters"] if p.get("name") == name]
        return dict(p["schema"])

    jobs, explain = BY_ID["list_jobs"].path, BY_ID["explain_job"].path
    assert param(jobs, "limit") == {
        "type": "integer",
        "minimum": 1,
        "maximum": 1000,
        "default": 100,
    }
    assert (LIMIT.lo, LIMIT.hi, LIMIT.default) == (1, 1000, 100)
    assert param(explain, "count")["maximum"] == COUNT.hi
