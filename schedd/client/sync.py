"""``Client``: :class:`~schedd.client.aio.AsyncClient` for synchronous code.

It runs an :class:`AsyncClient` on an event loop in a thread of its own, so submits made at the
same time from many threads are batched together exactly as concurrent coroutines are.  Use it
as a context manager (``with Client(...) as client``), or call :meth:`Client.close`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import Any, Self, TypeVar

from schedd.client.aio import AsyncClient
from schedd.client.models import Job, Run

T = TypeVar("T")


class Client:
    """The same calls as :class:`AsyncClient` (same arguments), blocking.  Listings are
    iterators that fetch a page at a time."""

    def __init__(self, servers: str | Sequence[str] | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="schedd-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self._async = self._call(_make(servers, options))
        except BaseException:
            self._stop()
            raise

    @property
    def index(self) -> int:
        """The highest ``X-Schedd-Index`` this client was given (see :class:`AsyncClient`)."""
        return self._async.index

    @index.setter
    def index(self, value: int) -> None:
        self._async.index = value

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Send the submits still waiting to be batched, then stop the client's thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._async.aclose())
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed and not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, agen: Any) -> Iterator[Any]:
        while True:
            try:
                yield self._call(agen.__anext__())
            except StopAsyncIteration:
                return

    # -- the calls ---------------------------------------------------------------------------

    def submit(self, task: str, payload: Any = None, **options: Any) -> Job:
        return self._call(self._async.submit(task, payload, **options))

    def submit_many(self, jobs: Sequence[Mapping[str, Any]]) -> list[Job]:
        return self._call(self._async.submit_many(jobs))

    def get(self, job_id: str) -> Job:
        return self._call(self._async.get(job_id))

    def jobs(self, *, page_size: int = 100, **filters: str) -> Iterator[Job]:
        return self._iterate(self._async.jobs(page_size=page_size, **filters))

    def runs(self, job_id: str, *, page_size: int = 100, **filters: str) -> Iterator[Run]:
        return self._iterate(self._async.runs(job_id, page_size=page_size, **filters))

    def dead_letters(self, *, page_size: int = 100, **filters: str) -> Iterator[Run]:
        return self._iterate(self._async.dead_letters(page_size=page_size, **filters))

    def run(self, run_id: str) -> Run:
        return self._call(self._async.run(run_id))

    def cancel(self, job_id: str) -> None:
        self._call(self._async.cancel(job_id))

    def cancel_run(self, run_id: str) -> Run:
        return self._call(self._async.cancel_run(run_id))

    def pause(self, job_id: str) -> Job:
        return self._call(self._async.pause(job_id))

    def resume(self, job_id: str) -> Job:
        return self._call(self._async.resume(job_id))

    def update(self, job_id: str, **fields: Any) -> Job:
        return self._call(self._async.update(job_id, **fields))

    def trigger(self, job_id: str, *, override: bool = False) -> Run:
        return self._call(self._async.trigger(job_id, override=override))

    def replay(self, run_id: str) -> Run:
        return self._call(self._async.replay(run_id))

    def drop(self, run_id: str) -> None:
        self._call(self._async.drop(run_id))

    def explain(self, job_id: str | None = None, **query: Any) -> list[dict[str, Any]]:
        return self._call(self._async.explain(job_id, **query))

    def cluster(self) -> dict[str, Any]:
        return self._call(self._async.cluster())

    def wait(self, ref: str, *, timeout: float | None = None) -> Run:
        return self._call(self._async.wait(ref, timeout=timeout))


async def _make(servers: str | Sequence[str] | None, options: dict[str, Any]) -> AsyncClient:
    return AsyncClient(servers, **options)  # made on the client's loop, where it is used
