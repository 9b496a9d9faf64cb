"""The coordinator of the namespaces' concurrency caps across shards, in a node's front door.

A namespace's cap holds for the cluster as a whole: each shard's leader leases at most its
allowance of it, and the allowances add up to the cap (:mod:`schedd.core.allowances`).  Every
ROUND_S, the front door of the node whose shard 0 leads (only it: another front door would do
no harm, only churn) asks each shard's leader what it has and what waits, delivers the
transfers given and not yet credited, and moves the slots one shard does not use towards the
shards whose runs wait (max-min fair, round by round when there are fewer slots than shards
that want one), lowering for a while what a shard over its share may lease so that its slots
free up.  Everything it asks is signed with the Raft secret (``POST /internal/caps``); a
shard it cannot reach neither gives nor takes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from schedd import clock
from schedd.config import Config, read_raft_secret
from schedd.core.allowances import ShardCaps, plan
from schedd.logs import log_event
from schedd.protocol.signed import caps_proof

log = logging.getLogger("schedd.shard.caps")

ROUND_S = 0.5  # between two rounds
HOLD_S = 3.0  # a soft limit holds this long unless said again (a lost coordinator's lapse)

#: (shard, body) -> (status, answer): a signed request to that shard's leader
Ask = Callable[[int, dict[str, Any]], Awaitable[tuple[int, Any]]]


class CapsCoordinator:
    def __init__(self, cfg: Config, shards: int, ask: Ask) -> None:
        self.cfg = cfg
        self.shards = shards
        self._ask = ask
        self._secret = read_raft_secret(cfg)
        self._turn = 0
        self._limited: set[int] = set()  # shards told a soft limit that still holds

    def signed(self, body: dict[str, Any]) -> dict[str, Any]:
        body = {**body, "at": clock.wall_ms()}
        body["proof"] = caps_proof(self._secret, body)
        return body

    async def ask(self, shard: int, body: dict[str, Any]) -> Any | None:
        """Shard ``shard``'s leader's answer, or None (not reachable, refused)."""
        try:
            status, answer = await self._ask(shard, self.signed(body))
        except (OSError, ValueError, TimeoutError) as exc:
            log_event(log, "caps.unreachable", level=logging.DEBUG, shard=shard, error=str(exc))
            return None
        if status != 200:
            log_event(
                log, "caps.refused", level=logging.DEBUG, shard=shard, status=status, answer=answer
            )
            return None
        return answer

    async def run(self) -> None:
        while True:
            if self.cfg.limits.concurrency:
                try:
                    await self.round()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one bad round must not stop the next
                    log_event(log, "caps.round_failed", level=logging.WARNING, error=repr(exc))
            await asyncio.sleep(ROUND_S)

    async def round(self) -> bool:
        """One round; whether this node coordinates (it leads shard 0)."""
        first = await self.ask(0, {"op": "view"})
        if first is None or first.get("node") != self.cfg.node.id:
            return False
        rest = await asyncio.gather(*(self.ask(k, {"op": "view"}) for k in range(1, self.shards)))
        views = {k: v for k, v in enumerate([first, *rest]) if isinstance(v, dict)}
        if await self.deliver(views):
            return True  # allowances changed: plan on what the shards say next round
        self._turn += 1
        limits: dict[int, dict[str, int]] = {}
        gave: set[int] = set()
        for ns, cap in self.cfg.limits.concurrency:
            view = {
                k: ShardCaps(**v["namespaces"][ns])
                for k, v in views.items()
                if ns in v.get("namespaces", {})
            }
            moves, soft = plan(cap, view, self._turn)
            for k, n in soft.items():
                limits.setdefault(k, {})[ns] = n
            for source, dest, amount in moves:
                await self.give(ns, source, dest, amount)
                gave.add(source)
        # what was given is credited now, in order with anything an earlier give left behind
        after = await asyncio.gather(*(self.ask(k, {"op": "view"}) for k in sorted(gave)))
        await self.deliver({k: v for k, v in zip(sorted(gave), after, strict=True) if v})
        for k in set(limits) | self._limited:
            if k in views:
                said = await self.ask(
                    k, {"op": "limit", "limits": limits.get(k, {}), "hold_s": HOLD_S}
                )
                if said is not None:  # told: limited, or no longer
                    (self._limited.add if k in limits else self._limited.discard)(k)
        return True

    async def give(self, ns: str, source: int, dest: int, amount: int) -> None:
        body = {"op": "give", "namespace": ns, "amount": amount, "dest": dest}
        given = await self.ask(source, body)
        if given and given.get("amount"):
            log_event(
                log, "caps.moved", namespace=ns, source=source, dest=dest, amount=given["amount"]
            )

    async def credit(self, source: int, dest: int, seq: int, ns: str, amount: int) -> bool:
        """Credit a transfer in ``dest``, then drop it from ``source``'s outbox; whether it is
        credited (else it stays in the outbox, for a later round)."""
        body = {"op": "take", "source": source, "seq": seq, "namespace": ns, "amount": amount}
        if await self.ask(dest, body) is None:
            return False
        await self.ask(source, {"op": "delivered", "dest": dest, "seq": seq})  # (or next round)
        return True

    async def deliver(self, views: dict[int, Any]) -> bool:
        """Deliver the transfers in the shards' outboxes, in order per (source, dest); whether
        there were any."""
        any_ = False
        for source, view in views.items():
            stuck: set[int] = set()
            for t in sorted(view.get("outbox", []), key=lambda t: t["seq"]):
                any_ = True
                if t["dest"] in stuck:
                    continue  # in order: not past one that could not be credited
                if not await self.credit(source, t["dest"], t["seq"], t["namespace"], t["amount"]):
                    stuck.add(t["dest"])
        return any_
