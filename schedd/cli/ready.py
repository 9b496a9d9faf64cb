"""``schedctl ready``: wait, for a bounded time, until the cluster answers with a leader and
knows this token; say why not when it does not (nothing listening, another cluster on the
port, no leader yet)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO

from schedd.cli import render
from schedd.cli.client import EXIT_OK, Client, CliError, Unreachable, write_text
from schedd.cli.settings import local_token

POLL_S = 0.2


def wait_ready(
    client: Client,
    timeout: float,
    out: IO[bytes],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """0 once a server knows the token and one answers ready (a leader known); exit 1 at once
    when a server refuses a token; exit 4 when ``timeout`` seconds pass first, with the last
    reason. Without a token, the local embedded node's is looked for again each time: a node
    starting here writes it a moment after it is started (for servers elsewhere there is none
    to wait for, and a refusal ends the wait at once, as with a token)."""
    deadline = clock() + timeout
    why = "no answer yet"
    while True:
        token = client.token or local_token(client.servers)
        # each round within what is left (one HTTP request may not outlast the wait)
        once = replace(
            client,
            token=token,
            timeout=max(0.1, min(client.timeout, deadline - clock())),
            retry_budget=0.0,
            max_retries=0,
            sleep=sleep,
            clock=clock,
        )
        try:
            who = once.request("GET", "/api/v1/whoami")
            if who.status == 401 and token is None and local_token(client.servers) is None:
                if not all(s.is_loopback for s in client.servers):
                    raise CliError(f"{who.server.url}: pass --token or --token-file", 1)
                why = f"{who.server.url}: no token yet (the local node writes its own)"
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
                    write_text(
                        out, f"ready: {ready.server.url} (leader {render.clean(str(leader))})"
                    )
                    return EXIT_OK
                body = ready.body.decode("utf-8", "replace")
                why = f"{ready.server.url}: {render.clean(body)[:200]}"
        except Unreachable as exc:
            why = exc.message
        if clock() + POLL_S > deadline:
            raise Unreachable(f"not ready after {timeout:g}s: {why}")
        sleep(POLL_S)
