"""Task handles: producers name a task the way they call it.

``@task("reports.generate")`` (``schedd.worker.task``) in a module shared by producers and
workers registers the handler for workers and returns a :class:`TaskHandle`: still the handler
when called, and also ``generate.submit(payload, in_="10m")`` (``.delay`` is an alias) for a
service that imports the module without running a worker, or ``await
generate.asubmit(...)`` from asyncio code (then ``await schedd.client.tasks.aclose()`` before
the event loop ends).  They use the client set with :func:`configure`,
else one made from ``SCHEDD_SERVER``, ``SCHEDD_TOKEN`` and ``SCHEDD_CACERT``.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

if TYPE_CHECKING:
    from schedd.client.aio import AsyncClient
    from schedd.client.models import Job
    from schedd.client.sync import Client

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_options: dict[str, Any] | None = None
_client: Client | None = None
_async_clients: dict[int, AsyncClient] = {}  # one per event loop


def configure(servers: str | list[str] | None = None, **options: Any) -> None:
    """The servers, token and other :class:`~schedd.client.AsyncClient` options the task
    handles submit with (replacing the environment's); with no arguments, the environment's
    again."""
    global _options, _client
    with _lock:
        _options = None if servers is None and not options else {"servers": servers, **options}
        old, _client = _client, None
        _async_clients.clear()
    if old is not None:
        old.close()


def _settings() -> dict[str, Any]:
    if _options is not None:
        return dict(_options)
    env: dict[str, Any] = {"servers": os.environ.get("SCHEDD_SERVER") or None}
    if os.environ.get("SCHEDD_TOKEN"):
        env["token"] = os.environ["SCHEDD_TOKEN"]
    if os.environ.get("SCHEDD_CACERT"):
        env["cafile"] = os.environ["SCHEDD_CACERT"]
    return env


def default_client() -> Client:
    """The synchronous client the handles use (made once, closed at exit)."""
    global _client
    with _lock:
        if _client is None:
            from schedd.client.sync import Client

            settings = _settings()
            _client = Client(settings.pop("servers"), **settings)
            atexit.register(_client.close)
        return _client


def default_async_client() -> AsyncClient:
    """The asynchronous client the handles use on the running event loop."""
    import asyncio

    loop = asyncio.get_running_loop()
    with _lock:
        client = _async_clients.get(id(loop))
        if client is None:
            from schedd.client.aio import AsyncClient

            settings = _settings()
            client = AsyncClient(settings.pop("servers"), **settings)
            _async_clients[id(loop)] = client
        return client


async def aclose() -> None:
    """Close the running event loop's client of the handles (:meth:`TaskHandle.asubmit`): call
    it before the loop ends, as for any aiohttp client, to send what waits to be batched and
    release its connections."""
    import asyncio

    with _lock:
        client = _async_clients.pop(id(asyncio.get_running_loop()), None)
    if client is not None:
        await client.aclose()


class TaskHandle(Generic[P, R]):
    """A task's handler (calling the handle calls it) that can also submit jobs of its task."""

    def __init__(self, name: str, fn: Callable[P, R]) -> None:
        self.name = name
        self.fn = fn
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<task {self.name!r}: {self.__module__}.{self.__qualname__}>"

    def submit(self, payload: Any = None, **options: Any) -> Job:
        """Submit a job of this task (the options of :meth:`AsyncClient.submit`); blocking."""
        return default_client().submit(self.name, payload, **options)

    delay = submit

    async def asubmit(self, payload: Any = None, **options: Any) -> Job:
        """:meth:`submit` for asyncio code (batched with the loop's other submits)."""
        return await default_async_client().submit(self.name, payload, **options)
