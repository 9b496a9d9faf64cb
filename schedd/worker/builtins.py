"""The built-in tasks every worker serves: ``http`` and (only when allowed) ``shell``."""

from __future__ import annotations

import asyncio
import math
import os
from typing import Any

import aiohttp
import orjson

from schedd.worker.registry import Context, Handler, NonRetryable

OUTPUT_LIMIT = 64 * 1024  # bytes of body / stdout / stderr kept in a result
ERROR_TAIL = 2048  # bytes of stderr or body quoted in an error message
SHELL_DISABLED = "shell task disabled; start the worker with --allow-shell"
_HIDDEN_ENV = ("SCHEDD_TOKEN",)  # never handed to a child process


class TaskFailed(Exception):
    """A built-in task failed in a way that may succeed on retry."""


def _payload_obj(task: str, payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise NonRetryable(f"{task}: payload: expected an object, got {type(payload).__name__}")
    return payload


def _timeout(task: str, value: Any, default: float | None) -> float | None:
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise NonRetryable(
            f"{task}: payload.timeout: expected a positive number of seconds, got {value!r}"
        )
    return float(value)


def _str_map(task: str, name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise NonRetryable(f"{task}: payload.{name}: expected an object of string values")
    return value


def _text(data: bytes, limit: int = OUTPUT_LIMIT, *, tail: bool = False) -> str:
    cut = data[-limit:] if tail else data[:limit]
    return cut.decode("utf-8", errors="replace")


# -- http --------------------------------------------------------------------------------------


async def http_task(ctx: Context, payload: Any) -> dict[str, Any]:
    """``{method="GET", url, headers={}, body=None, timeout=30}`` → ``{status, headers, body}``.

    A ``body`` string is sent as is; any other JSON value is sent as JSON.  Status ≥ 500 and
    network errors fail retryably, 4xx fails for good.
    """
    p = _payload_obj("http", payload)
    url = p.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise NonRetryable(f"http: payload.url: expected an http(s) URL, got {url!r}")
    method = p.get("method", "GET")
    if not isinstance(method, str) or not method.isalpha():
        raise NonRetryable(f"http: payload.method: expected an HTTP method, got {method!r}")
    headers = dict(_str_map("http", "headers", p.get("headers")))
    timeout = _timeout("http", p.get("timeout"), 30.0)
    body = p.get("body")
    data: bytes | None = None
    if isinstance(body, str):
        data = body.encode()
    elif body is not None:
        data = orjson.dumps(body)
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.request(method.upper(), url, headers=headers, data=data) as resp,
        ):
            raw = await _read_capped(resp.content, OUTPUT_LIMIT)
            status = resp.status
            resp_headers: dict[str, str] = {}
            for key, v in resp.headers.items():
                k = str(key)  # istr → str: JSON keys must be plain strings
                resp_headers[k] = f"{resp_headers[k]}, {v}" if k in resp_headers else v
            charset = resp.charset or "utf-8"
    except TimeoutError:
        raise TaskFailed(f"http: {method.upper()} {url} timed out after {timeout:g}s") from None
    except aiohttp.InvalidURL as exc:
        raise NonRetryable(f"http: payload.url: invalid URL {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise TaskFailed(
            f"http: {method.upper()} {url} failed: {type(exc).__name__}: {exc}"
        ) from None
    try:
        text = raw[:OUTPUT_LIMIT].decode(charset, errors="replace")
    except LookupError:  # unknown charset
        text = raw[:OUTPUT_LIMIT].decode("utf-8", errors="replace")
    result = {
        "status": status,
        "headers": resp_headers,
        "body": text,
        "truncated": len(raw) > OUTPUT_LIMIT,
    }
    if status >= 500:
        raise TaskFailed(f"http: {method.upper()} {url} returned {status}: {text[-ERROR_TAIL:]}")
    if status >= 400:
        raise NonRetryable(f"http: {method.upper()} {url} returned {status}: {text[-ERROR_TAIL:]}")
    return result


async def _read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """Read up to ``limit + 1`` bytes (one more tells the caller it was truncated)."""
    buf = bytearray()
    while len(buf) <= limit:
        chunk = await stream.read(limit + 1 - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


# -- shell -------------------------------------------------------------------------------------


async def shell_task(ctx: Context, payload: Any) -> dict[str, Any]:
    """``{argv: [str, ...], cwd?, env?, timeout?}`` → ``{exit_code, stdout, stderr}``.

    Runs ``argv`` directly (``create_subprocess_exec``), never through a shell.  ``env`` is
    merged over the worker's environment (minus ``SCHEDD_TOKEN``).  Output keeps the last
    64 KiB of each stream.  A non-zero exit fails retryably with the tail of stderr.
    """
    p = _payload_obj("shell", payload)
    argv = p.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise NonRetryable(
            "shell: payload.argv: expected a non-empty list of strings (the command is never "
            f"run through a shell), got {type(argv).__name__}"
        )
    if not argv[0]:
        raise NonRetryable("shell: payload.argv[0]: expected a program name, got ''")
    cwd = p.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise NonRetryable(f"shell: payload.cwd: expected a directory path, got {cwd!r}")
    env = {k: v for k, v in os.environ.items() if k not in _HIDDEN_ENV}
    env.update(_str_map("shell", "env", p.get("env")))
    timeout = _timeout("shell", p.get("timeout"), None)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        raise NonRetryable(f"shell: cannot start {argv[0]!r}: {exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            out, err, code = await asyncio.gather(
                _read_tail(proc.stdout), _read_tail(proc.stderr), proc.wait()
            )
    except TimeoutError:
        raise TaskFailed(f"shell: {argv[0]} timed out after {timeout:g}s") from None
    finally:
        if proc.returncode is None:  # timed out or cancelled: do not leave it running
            proc.kill()
            await asyncio.shield(proc.wait())
    result = {"exit_code": code, "stdout": _text(out, tail=True), "stderr": _text(err, tail=True)}
    if code != 0:
        raise TaskFailed(
            f"shell: {argv[0]} exited with {code}: {_text(err, ERROR_TAIL, tail=True)}"
        )
    return result


async def _read_tail(stream: asyncio.StreamReader, limit: int = OUTPUT_LIMIT) -> bytes:
    buf = bytearray()
    while chunk := await stream.read(65536):
        buf += chunk
        if len(buf) > limit:
            del buf[: len(buf) - limit]
    return bytes(buf)


def builtin_handlers(allow_shell: bool) -> dict[str, Handler]:
    handlers: dict[str, Handler] = {"http": http_task}
    if allow_shell:
        handlers["shell"] = shell_task
    return handlers
