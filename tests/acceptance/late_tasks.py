"""A task only the late worker of ``test_task_routing.py`` runs (``--import
tests.acceptance.late_tasks``)."""

from __future__ import annotations

from typing import Any

from schedd.worker import Context, task


@task("acc.late")
async def late(ctx: Context, payload: Any) -> dict[str, Any]:
    return {"run_id": ctx.run_id, "by": ctx.worker_id}
