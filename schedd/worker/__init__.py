"""The schedd worker SDK.

```python
from schedd.worker import Worker

worker = Worker(["http://10.0.0.1:7700"], token="...", queues=["default"], concurrency=8)

@worker.task("reports.generate")
async def generate(ctx, payload):
    ...

worker.run()
```

May import: core, protocol and the foundation modules; never the server's packages (a worker
machine needs no part of the daemon).
"""

from schedd.worker.client import Worker, WorkerRefused
from schedd.worker.registry import Context, NonRetryable, Registry, default_registry, task

__all__ = [
    "Context",
    "NonRetryable",
    "Registry",
    "Worker",
    "WorkerRefused",
    "default_registry",
    "task",
]
