"""Submit and inspect schedd jobs from Python.

.. code-block:: python

    from schedd.client import AsyncClient

    async with AsyncClient("http://10.0.0.1:7700,http://10.0.0.2:7700", token=TOKEN) as client:
        job = await client.submit("reports.generate", {"report": "sales"}, in_="10m")
        run = await client.wait(job.id)

``Client`` is the same, synchronously.  Concurrent submits are batched by themselves; every
write is safe to retry.  See ``docs/client.md``.
"""

from schedd.client.aio import AsyncClient
from schedd.client.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    SchedError,
    Unauthenticated,
    Unavailable,
    Unreachable,
)
from schedd.client.models import Attempt, Job, Run
from schedd.client.sync import Client

__all__ = [
    "AsyncClient",
    "Attempt",
    "Client",
    "Conflict",
    "InvalidArgument",
    "Job",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Run",
    "SchedError",
    "Unauthenticated",
    "Unavailable",
    "Unreachable",
]
