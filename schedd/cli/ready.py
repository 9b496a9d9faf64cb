"""``schedctl ready``: wait, for a bounded time, until the cluster answers with a leader and
knows this token; say why not when it does not (nothing listening, another cluster on the
port, no leader yet)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO

from schedd.cli import render
from schedd.cli.client import Client, CliError, Unreachable

EXIT_OK = 0
POLL_S = 0.2


def wait_ready(
    client: Client,
    timeout: float,
    out: IO[bytes],
    token: Callable[[], str | None] = lambda: None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """0 once a server knows the token and one answers ready (a leader known); exit 1 at once
    when a server refuses a token that was given (the cluster on this address is not the one
    it is for); exit 4 when ``timeout`` seconds pass first, with the last reason.  Without a
    token, ``token()`` is asked again each time: a node starting here writes its admin token
    to the tokens file a moment after it is started."""
    once = replace(client, retry_budget=0.0, max_retries=0, sleep=sleep, clock=clock)
    deadline = clock() + timeout
    why = "no answer yet"
    while True:
        if once.token is None:
            once = replace(once, token=token())
        try:
            who = once.request("GET", "/api/v1/whoami")
            if who.status == 401 and once.token is None:
                why = f"{who.server.url}: no token yet (pass --token or --token-file)"
            elif who.status == 401:
                raise CliError(
                    f"{who.server.url}: this server does not know the token: is it the cluster "
                    "you mean (another may be listening on this port), or pass --token / "
                    "--token-file",
                    1,
                )
            else:
                ready = once.request("GET", "/readyz")
                if ready.status == 200:
                    leader = ready.json().get("leader") if ready.body else None
                    out.write(
                        f"ready: {ready.server.url} (leader {render.clean(str(leader))})\n".encode()
                    )
                    return EXIT_OK
                why = f"{ready.server.url}: {render.clean(ready.body.decode('utf-8', 'replace'))[:200]}"
        except Unreachable as exc:
            why = exc.message
        if clock() + POLL_S > deadline:
            raise Unreachable(f"not ready after {timeout:g}s: {why}")
        sleep(POLL_S)
