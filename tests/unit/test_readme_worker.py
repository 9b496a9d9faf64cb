"""The README's "Writing a worker" example, run as written (without connecting): its handler
refuses a missing report for good, with or without a payload, and returns its result."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from schedd.protocol.messages import Complete, Fail, Lease
from schedd.worker import Worker

README = Path(__file__).resolve().parents[2] / "README.md"


def example_worker() -> Worker:
    text = README.read_text()
    section = text[text.index("Writing a worker:") :]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block is not None
    code = block.group(1).replace("worker.run()", "")  # built, not run
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    worker = namespace["worker"]
    assert isinstance(worker, Worker)
    return worker


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (None, Fail("r@1", 3, "NonRetryable: payload.report is required", retryable=False)),
        ({}, Fail("r@1", 3, "NonRetryable: payload.report is required", retryable=False)),
        ({"report": "x"}, Complete("r@1", 3, {"rows": 42})),
    ],
)
def test_the_readme_worker_example_handles_every_payload(payload: Any, expected: Any) -> None:
    worker = example_worker()
    lease = Lease("r@1", "J", 1, 3, "reports.generate", payload, "2026-11-25T02:00:00Z")
    got = asyncio.run(worker.execute(lease))
    if isinstance(got, Fail):  # a deliberate NonRetryable: its message says it all
        assert got.traceback is None
    assert got == expected
