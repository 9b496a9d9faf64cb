"""A small server-sent events reader for the tests of ``GET /api/v1/events`` (as a page reads
them with fetch: a stream of lines, events separated by a blank line)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class Event:
    kind: str
    data: Any
    id: int | None  # the id field of this event, if it had one


@dataclass
class Stream:
    """The events of one response, and the last id seen (what a client resumes from)."""

    resp: aiohttp.ClientResponse
    last_id: int | None = None
    comments: int = 0
    events: list[Event] = field(default_factory=list)

    async def next(self, timeout: float = 10.0) -> Event | None:
        """The next event (None at the end of the stream)."""
        kind, data, event_id = "message", [], None
        while True:
            raw = await asyncio.wait_for(self.resp.content.readline(), timeout)
            if not raw:
                return None
            line = raw.decode().rstrip("\n")
            if line == "":
                if not data and event_id is None:
                    continue
                event = Event(kind, orjson.loads("\n".join(data)), event_id)
                if event_id is not None:
                    self.last_id = event_id
                self.events.append(event)
                return event
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = int(value)

    async def until(self, kind: str, timeout: float = 10.0) -> Event:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = await self.next(max(0.01, deadline - loop.time()))
            if event is None:
                raise AssertionError(f"the stream ended before a {kind} event")
            if event.kind == kind:
                return event

    async def rest(self, timeout: float = 10.0) -> list[Event]:
        """Every event up to the end of the stream (follow=false)."""
        out = []
        while (event := await self.next(timeout)) is not None:
            out.append(event)
        return out


def changes(events: list[Event], kind: str) -> list[dict[str, Any]]:
    """The changes of the ``kind`` events, in order."""
    return [c for e in events if e.kind == kind for c in e.data]
