"""HTTP/1.1 to one shard's API over its Unix socket, for the requests the front door forwards
as they are: kept-alive connections reused, the request written in one piece and the answer
read whole.  (aiohttp's client cost more CPU per request than the rest of the forward; the
answers of streams - the change feed, snapshots, websockets - still go through it.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

#: a connection that was idle may have been closed by the shard (its keep-alive timeout, a
#: restart): a request that finds it closed before any answer is sent again on a new one
_RETRIES = 1
MAX_HEAD = 64 << 10


class LinkError(ConnectionError):
    """The shard's socket could not be used, or its answer was not HTTP."""


class ShardLink:
    def __init__(self, path: str, keep: int = 64) -> None:
        self.path = path
        self._keep = keep
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send one request; its answer: (status, headers, body)."""
        head = [f"{method} {target} HTTP/1.1\r\nHost: shard\r\n"]
        head.extend(f"{k}: {v}\r\n" for k, v in headers)
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        data = "".join(head).encode("latin-1") + body
        for attempt in range(_RETRIES + 1):
            reused = bool(self._idle)
            try:
                if reused:
                    reader, writer = self._idle.pop()
                else:
                    reader, writer = await asyncio.open_unix_connection(self.path, limit=MAX_HEAD)
            except OSError as exc:
                raise LinkError(f"cannot connect to {self.path}: {exc}") from None
            try:
                writer.write(data)
                status, answer_headers, payload, keep = await _read_answer(reader)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                writer.close()
                if reused and attempt < _RETRIES:
                    continue  # a connection the shard had closed: once more on a new one
                raise LinkError(f"{self.path}: {exc or type(exc).__name__}") from None
            except BaseException:
                writer.close()
                raise
            if keep and len(self._idle) < self._keep:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return status, answer_headers, payload
        raise AssertionError("unreachable")


async def _read_answer(
    reader: asyncio.StreamReader,
) -> tuple[int, list[tuple[str, str]], bytes, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise OSError(f"not an HTTP answer: {lines[0][:60]!r}")
    status = int(parts[1])
    headers: list[tuple[str, str]] = []
    length: int | None = None
    chunked = False
    keep = parts[0] == "HTTP/1.1"
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        value = value.strip()
        lower = name.lower()
        if lower == "content-length":
            length = int(value)
        elif lower == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif lower == "connection":
            keep = value.lower() != "close" and (keep or value.lower() == "keep-alive")
        headers.append((name, value))
    if chunked:
        body = await _read_chunked(reader)
    elif length is not None:
        body = await reader.readexactly(length)
    elif status in (204, 304) or 100 <= status < 200:
        body = b""
    else:  # the body ends with the connection
        body, keep = await reader.read(), False
    return status, headers, body, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readexactly(2)
