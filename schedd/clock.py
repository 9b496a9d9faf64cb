"""The only place that reads clocks.  Wall clock (UTC ms) for fire times; monotonic for timers."""

from __future__ import annotations

import time


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def mono() -> float:
    return time.monotonic()
