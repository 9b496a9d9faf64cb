"""Task handlers by name, the context a handler receives, and the :class:`NonRetryable` signal."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from schedd.client.tasks import TaskHandle

Handler = Callable[["Context", Any], Any]  # async def f(ctx, payload) or def f(ctx, payload)
H = TypeVar("H", bound=Handler)
P = ParamSpec("P")
R = TypeVar("R")


class NonRetryable(Exception):  # the name users raise (docs/worker-protocol.md)
    """Raise (or subclass) this in a handler to fail the run without further retries."""


@dataclass(eq=False)
class Context:
    """What a handler knows about the attempt it is running.

    ``cancelled`` is set when the server cancels the run (the handler task is cancelled too; a
    plain ``def`` handler running in a thread cannot be interrupted and should poll
    ``ctx.cancelled.is_set()``).  Assign ``ctx.progress`` any JSON value to report it with the
    next heartbeat.
    """

    run_id: str
    job_id: str
    attempt: int
    fence: int
    task: str
    scheduled_at: str
    deadline: str | None = None
    idempotency_key: str | None = None
    worker_id: str = ""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    progress: Any = None


class Registry:
    """A mapping of task name to handler."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def task(self, name: str) -> Callable[[Callable[P, R]], TaskHandle[P, R]]:
        """Decorator: register ``fn`` as the handler of task ``name``; returns a
        :class:`~schedd.client.tasks.TaskHandle`: the handler when called, and
        ``.submit(payload, **options)`` / ``.delay`` / ``.asubmit`` for producers."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"task name: expected a non-empty string, got {name!r}")

        def register(fn: Callable[P, R]) -> TaskHandle[P, R]:
            handle = TaskHandle(name, fn.fn if isinstance(fn, TaskHandle) else fn)
            self.register(name, handle)
            return handle

        return register

    def register(self, name: str, fn: Handler) -> None:
        if not callable(fn):
            raise TypeError(f"task {name!r}: expected a callable handler, got {fn!r}")
        old = self._handlers.get(name)
        if old is not None and old is not fn and _qualname(old) != _qualname(fn):
            raise ValueError(f"task {name!r} is already registered to {_qualname(old)}")
        self._handlers[name] = fn  # same function (or a reloaded module): replace

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._handlers)


def _qualname(fn: Handler) -> str:
    fn = fn.fn if isinstance(fn, TaskHandle) else fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def is_async(fn: Handler) -> bool:
    fn = fn.fn if isinstance(fn, TaskHandle) else fn
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


default_registry = Registry()


def task(name: str) -> Callable[[Callable[P, R]], TaskHandle[P, R]]:
    """Module-level decorator: register a handler in the default registry.

    ``schedd-worker --import my.tasks`` imports modules that use it, and every :class:`Worker`
    created without an explicit ``registry`` serves these handlers.
    """
    return default_registry.task(name)
