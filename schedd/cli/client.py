"""The HTTP client behind ``schedctl``: standard library only, one request at a time.

It tries the servers in order.  A server that cannot be reached (refused, timed out, name not
resolved) is skipped; one that answers 503 with ``Retry-After`` is retried a few times within a
shared budget of about ten seconds, then skipped.  When no server gives a real answer the
request fails with :class:`Unreachable` (exit code 4), naming every server and what went wrong.

A request that is not safe to repeat (a ``POST`` without an idempotency key) is never sent to a
second server once the first may have received it: a timeout after sending means the outcome is
unknown, and the error says so instead of risking a duplicate.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlencode

import orjson

from schedd.client.servers import Server, parse_retry_after
from schedd.client.servers import parse_server as _parse_server
from schedd.errors import InvalidArgument
from schedd.ids import new_request_id
from schedd.net import TrustError, ca_context
from schedd.protocol.headers import INDEX_HEADER, MIN_INDEX_HEADER

RETRY_BUDGET = 10.0  # seconds spent waiting on 503s, over all servers
MAX_RETRIES = 3  # retries of one server after a 503, before moving on
BACKOFF = 0.1  # first wait when Retry-After says 0
_FAILOVER_STATUS = frozenset({502, 503, 504})
_USER_AGENT = "schedctl"


#: schedctl's exit codes (docs/cli.md)
EXIT_OK = 0
EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
EXIT_FAILED = 5
EXIT_CANCELLED = 6
EXIT_WAIT_TIMEOUT = 7


def write_text(out: IO[bytes], text: str) -> None:
    """``text`` and a newline on ``out``; nothing for no text (``-q`` with nothing to show)."""
    if text:
        out.write(text.encode("utf-8", "replace") + b"\n")


class CliError(Exception):
    """An error ``schedctl`` reports on stderr and turns into an exit code."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(CliError):
    """The command line is wrong (exit 2)."""

    exit_code = 2


class Unreachable(CliError):
    """No server gave an answer (exit 4)."""

    exit_code = 4


def parse_server(text: str) -> Server:
    """``--server``'s URL (see :func:`schedd.client.servers.parse_server`); a usage error."""
    try:
        return _parse_server(text)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None


def tls_context(cafile: str, option: str = "--cacert") -> ssl.SSLContext:
    """A TLS context for https servers that trusts only the CA certificates in ``cafile``
    (PEM).  A file that cannot be used is a :class:`UsageError` naming ``option``."""
    try:
        return ca_context(cafile)
    except TrustError as exc:
        raise UsageError(f"{option}: {exc}") from None


class Body:
    """The body of a 2xx answer to a request made with ``stream=True``, read as it comes;
    :meth:`close` it (it holds the connection)."""

    def __init__(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection) -> None:
        self._resp, self._conn = resp, conn

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes as they arrive; ``b""`` at the end.  ``OSError`` (a timeout, a
        reset) or ``http.client.HTTPException`` (the stream cut short) when it breaks."""
        return self._resp.read1(size)

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True)
class Response:
    server: Server
    status: int
    reason: str
    headers: Mapping[str, str]  # lower-cased names
    body: bytes
    #: a 2xx answer to a request made with ``stream=True``: its body, still to be read
    stream: Body | None = None

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise CliError(
                f"{self.server.url}: the server answered {self.status} with a body that is not "
                f"JSON; is this a schedd server?"
            ) from None

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))


@dataclass
class _Failure:
    server: Server
    problem: str
    connect: bool  # could not connect at all (as opposed to an unusable answer)


class _NotSent(Exception):
    pass


class _MaybeSent(Exception):
    pass


# A problem that carries its own advice (after "; ") replaces the generic "is schedd running?".
_ADVICE = "; "
_TLS_HINT = "pass --cacert FILE or set SCHEDD_CACERT to the CA that signed the server's certificate"
_HOSTNAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


def _describe_tls(exc: ssl.SSLError, scheme: str) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or "verification failed"
        if exc.verify_code in _HOSTNAME_MISMATCH:
            return (
                f"TLS certificate refused ({why}){_ADVICE}use a URL with a host name or "
                f"address that the server's certificate names"
            )
        return f"TLS certificate not trusted ({why}){_ADVICE}{_TLS_HINT}"
    reason = exc.reason or str(exc)
    if reason == "WRONG_VERSION_NUMBER" and scheme == "https":
        return f"TLS handshake failed: the server does not speak TLS{_ADVICE}use an http:// URL"
    return f"TLS handshake failed ({reason})"


def describe(exc: BaseException, timeout: float, server: Server) -> str:
    """What went wrong with a connection to ``server``, in a few words."""
    if isinstance(exc, http.client.IncompleteRead):
        return "the server closed the connection in the middle of its answer"
    return _describe(exc, timeout, server.host, server.scheme).split(_ADVICE)[0]


def _describe(exc: BaseException, timeout: float, host: str, scheme: str = "http") -> str:
    if isinstance(exc, ssl.SSLError):
        return _describe_tls(exc, scheme)
    if scheme == "http" and isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError):
        # also what a TLS port does with a plain-http request
        return (
            f"closed the connection without answering{_ADVICE}if it serves https, use an "
            "https:// URL"
        )
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out after {timeout:g}s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host {host!r}"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "closed the connection without answering"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


@dataclass
class Client:
    servers: Sequence[Server]
    token: str | None = None
    timeout: float = 10.0
    retry_budget: float = RETRY_BUDGET
    max_retries: int = MAX_RETRIES
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    #: for https servers (see :func:`tls_context`); None: the system's trusted CAs
    ssl_context: ssl.SSLContext | None = None
    _preferred: int = field(default=0, repr=False)
    #: the highest X-Schedd-Index an answer carried: later reads ask for at least it, so a
    #: command reads what it wrote (or what an earlier read showed) on whichever server answers
    index: int = 0

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        idempotent: bool = True,
        stream: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> Response:
        """The first real answer from a server, whatever its status (except 502/503/504).
        ``stream``: a 2xx answer's body is left to read from ``Response.stream``; ``extra``:
        more request headers."""
        target = path + (("?" + urlencode(list(query))) if query else "")
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT, **(extra or {})}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        # The server deduplicates writes by request id, so a write repeated on another server
        # after a lost reply is applied once.
        headers["X-Request-Id"] = new_request_id()
        if method == "GET" and self.index:
            headers[MIN_INDEX_HEADER] = str(self.index)
        deadline = self.clock() + self.retry_budget
        failures: list[_Failure] = []
        order = list(self.servers[self._preferred :]) + list(self.servers[: self._preferred])
        for server in order:
            resp = self._try_server(
                server, method, target, body, headers, deadline, idempotent, failures, stream
            )
            if resp is not None:
                # later requests (e.g. the pages of `list --all`) start with the server that answered
                self._preferred = list(self.servers).index(server)
                seen = resp.headers.get(INDEX_HEADER.lower(), "")
                if seen.isdigit():
                    self.index = max(self.index, int(seen))
                return resp
        raise Unreachable(_unreachable_message(failures))

    def _try_server(
        self,
        server: Server,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        deadline: float,
        idempotent: bool,
        failures: list[_Failure],
        stream: bool = False,
    ) -> Response | None:
        for retry in range(self.max_retries + 1):
            try:
                resp = self._send(server, method, server.base_path + target, body, headers, stream)
            except _NotSent as exc:
                failures.append(_Failure(server, str(exc), connect=True))
                return None
            except _MaybeSent as exc:
                if not idempotent:
                    raise Unreachable(
                        f"{server.url}: {exc} after the request was sent, so it may or may not "
                        f"have been applied; check with `schedctl list` before repeating it "
                        f"(pass --idempotency-key to make repeating it safe)"
                    ) from None
                failures.append(_Failure(server, str(exc), connect=True))
                return None
            if resp.status not in _FAILOVER_STATUS:
                return resp
            wait = resp.retry_after
            failures.append(_Failure(server, _status_problem(resp, retry), connect=False))
            if resp.status != 503 or wait is None or retry == self.max_retries:
                return None
            wait = max(wait, BACKOFF * 2**retry)
            if self.clock() + wait > deadline:
                return None
            self.sleep(wait)
            failures.pop()
        return None

    def _send(
        self,
        server: Server,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        stream: bool = False,
    ) -> Response:
        conn: http.client.HTTPConnection
        if server.scheme == "https":
            conn = http.client.HTTPSConnection(
                server.host, server.port, timeout=self.timeout, context=self.ssl_context
            )
        else:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=self.timeout)
        kept: Body | None = None
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise _NotSent(_describe(exc, self.timeout, server.host, server.scheme)) from None
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                names = {k.lower(): v for k, v in resp.getheaders()}
                if stream and 200 <= resp.status < 300:
                    kept = Body(resp, conn)
                    return Response(server, resp.status, resp.reason, names, b"", kept)
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise _MaybeSent(_describe(exc, self.timeout, server.host, server.scheme)) from None
            return Response(server, resp.status, resp.reason, names, data)
        finally:
            if kept is None:
                conn.close()


def _status_problem(resp: Response, retry: int) -> str:
    text = f"{resp.status} {resp.reason}".strip()
    try:
        err = orjson.loads(resp.body).get("error")
        text = f"{err['code']}: {err['message']}"
    except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError):
        pass
    if retry:
        text += f" (still after {retry} {'retry' if retry == 1 else 'retries'})"
    return text


def _unreachable_message(failures: list[_Failure]) -> str:
    from schedd.cli.render import clean

    if failures and all(f.connect for f in failures):
        if len(failures) == 1 and _ADVICE in failures[0].problem:
            return clean(f"cannot reach {failures[0].server.url}: {failures[0].problem}")
        where = ", ".join(f"{f.server.url} ({f.problem})" for f in failures)
        prefix = "cannot reach " if len(failures) == 1 else "cannot reach any server: "
        if any(_ADVICE in f.problem for f in failures):
            return f"{prefix}{clean(where)}"  # the problems say what to do
        return (
            f"{prefix}{clean(where)}; is schedd running? start one with `schedd` or pass --server"
        )
    where = "; ".join(f"{f.server.url}: {f.problem}" for f in failures)
    return (
        f"cluster unavailable: {clean(where)}; the cluster may have no leader or no quorum yet: "
        f"check the nodes with `schedctl cluster` or their logs, and try again"
    )
