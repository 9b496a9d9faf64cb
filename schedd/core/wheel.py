"""The leader's hierarchical timing wheel: which keys are due, and when is the next one.

Pure code: time comes in as integer milliseconds since the epoch; nothing here reads a clock.

Structure (Varghese & Lauck hierarchical wheel, with absolute, digit-aligned buckets):

* ``levels`` wheels of ``wheel_size`` buckets.  A bucket at level ``L`` covers
  ``unit(L) = tick_ms * wheel_size**L`` milliseconds, aligned to multiples of that unit.
* A key due at ``d`` (with ``d > now``) lives at the lowest level ``L`` whose enclosing block of
  ``unit(L+1)`` ms is the one ``now`` is in, in the slot ``(d // unit(L)) % wheel_size``.
  Levels therefore never overlap and never wrap: level 0 holds the rest of the current
  ``unit(1)`` block, level 1 the rest of the current ``unit(2)`` block, and so on; within a level,
  slot order is time order.  Keys beyond the top block wait in an *overflow* bucket; keys already
  due (``d <= now``) wait in a *ready* bucket for the next :meth:`TimingWheel.advance`.
* Because a key's bucket is a function of ``(due, now)``, ``remove``/move find the old bucket in
  O(1) from the index ``dict[key, stamp]``.  The stamp is one int, ``due << 64 | seq``, where
  ``seq`` counts :meth:`~TimingWheel.add` calls: it orders ties by insertion order and tells a
  live bucket entry from a stale one (a moved or removed key leaves its old entry behind; the
  entry is stale because its stamp no longer matches the index).
* Each bucket keeps parallel ``keys``/``stamps`` lists, a live count (so an all-stale bucket is
  emptied at once and counts as empty), a cached exact minimum, and whether its entries are in
  stamp order (then the minimum after a removal is found by walking forward).  A bucket whose
  stale entries outnumber its live ones is compacted, so moves cannot leak memory.
* :meth:`~TimingWheel.advance` never walks ticks: a bitmask of non-empty slots per level gives
  the earliest non-empty bucket directly.  Buckets that end at or before the new time are
  drained whole; the first bucket that straddles it is split (due keys out, the rest re-placed
  one level down, or put back in the same level-0 bucket), which is the cascade.  The overflow
  bucket is re-placed only when time crosses into a new top-level block.
* :meth:`~TimingWheel.next_due_ms` looks at the ready bucket, then the first non-empty bucket
  of the lowest non-empty level, then the overflow: the first one found holds the minimum.
"""

from __future__ import annotations

__all__ = ["TimingWheel"]

_SEQ_BITS = 64


class _Bucket:
    """One bucket: parallel key/stamp lists, possibly holding stale entries before ``live``."""

    __slots__ = ("bit", "head", "keys", "least", "level", "live", "ordered", "stamps")

    def __init__(self, level: int, bit: int) -> None:
        self.keys: list[str] = []
        self.stamps: list[int] = []
        self.head = 0  # entries before ``head`` are dead (left by walking the minimum forward)
        self.live = 0  # live entries (those whose stamp is still the key's stamp in the index)
        self.least: int | None = None  # exact minimum live stamp, or None when unknown
        self.ordered = True  # stamps[head:] ascending
        self.level = level  # index into TimingWheel._masks
        self.bit = bit

    def reset(self) -> None:
        self.keys = []
        self.stamps = []
        self.head = 0
        self.live = 0
        self.least = None
        self.ordered = True


class TimingWheel:
    """Keys with due times; :meth:`advance` hands back the ones that have come due, in order."""

    __slots__ = (
        "_index",
        "_levels",
        "_masks",
        "_now",
        "_overflow",
        "_ready",
        "_seq",
        "_size",
        "_tick",
        "_units",
        "_wheels",
    )

    def __init__(
        self, now_ms: int, tick_ms: int = 10, wheel_size: int = 64, levels: int = 5
    ) -> None:
        if tick_ms < 1:
            raise ValueError(f"tick_ms must be at least 1, got {tick_ms}")
        if wheel_size < 2:
            raise ValueError(f"wheel_size must be at least 2, got {wheel_size}")
        if levels < 1:
            raise ValueError(f"levels must be at least 1, got {levels}")
        self._tick = tick_ms
        self._size = wheel_size
        self._levels = levels
        # _units[L] is the width of one bucket at level L; _units[levels] spans the whole wheel.
        self._units = [tick_ms * wheel_size**level for level in range(levels + 1)]
        self._now = now_ms
        self._seq = 0
        self._index: dict[str, int] = {}
        self._wheels = [
            [_Bucket(level, 1 << slot) for slot in range(wheel_size)] for level in range(levels)
        ]
        # masks[0:levels] flag non-empty slots per level; the two extra ones belong to the
        # ready and overflow buckets, so pushes and discards need no special case.
        self._masks = [0] * (levels + 2)
        self._ready = _Bucket(levels, 1)
        self._overflow = _Bucket(levels + 1, 1)

    # ----------------------------------------------------------------------------- public API

    def add(self, key: str, due_ms: int) -> None:
        """Insert ``key`` due at ``due_ms``, or move it there if present (the new due wins).

        Every call counts as a fresh insertion for ordering ties, moves included.
        """
        stamp = (due_ms << _SEQ_BITS) + self._seq
        self._seq += 1
        old = self._index.get(key)
        self._index[key] = stamp
        if old is not None:
            self._discard(self._locate(old >> _SEQ_BITS), old)
        self._push(self._locate(due_ms), key, stamp)

    def remove(self, key: str) -> bool:
        """Forget ``key``; True if it was present."""
        old = self._index.pop(key, None)
        if old is None:
            return False
        self._discard(self._locate(old >> _SEQ_BITS), old)
        return True

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def due_of(self, key: str) -> int | None:
        """The due time of ``key``, or None if it is not present."""
        stamp = self._index.get(key)
        return None if stamp is None else stamp >> _SEQ_BITS

    def advance(self, now_ms: int) -> list[str]:
        """Move time to ``now_ms``; remove and return every key due at or before it.

        The result is ordered by (due time, insertion order).  Time never goes backwards: an
        earlier ``now_ms`` changes nothing and returns only keys that were already due (added
        with a due time at or before the wheel's current time).
        """
        out: list[str] = []
        self._take_all(self._ready, out)
        if now_ms > self._now:
            self._sweep(now_ms, out)
        if out:
            index = self._index
            if len(out) > 1:
                out.sort(key=index.__getitem__)
            for key in out:
                del index[key]
            if not index:
                self._index = {}  # let a drained index give its table back
        return out

    def next_due_ms(self) -> int | None:
        """The earliest pending due time, exactly, or None when empty."""
        if self._ready.live:
            return self._least(self._ready) >> _SEQ_BITS
        masks = self._masks
        for level in range(self._levels):
            mask = masks[level]
            if mask:
                slot = (mask & -mask).bit_length() - 1
                return self._least(self._wheels[level][slot]) >> _SEQ_BITS
        if self._overflow.live:
            return self._least(self._overflow) >> _SEQ_BITS
        return None

    def clear(self) -> None:
        """Forget every key (the current time stays)."""
        self._index = {}
        for wheel in self._wheels:
            for bucket in wheel:
                if bucket.live or bucket.keys:
                    bucket.reset()
        self._ready.reset()
        self._overflow.reset()
        self._masks = [0] * (self._levels + 2)

    # ------------------------------------------------------------------------------ internals

    def _locate(self, due_ms: int) -> _Bucket:
        """The bucket a key due at ``due_ms`` belongs in, given the current time."""
        now = self._now
        if due_ms <= now:
            return self._ready
        size = self._size
        due_q = due_ms // self._tick
        now_q = now // self._tick
        for wheel in self._wheels:
            due_hi = due_q // size
            now_hi = now_q // size
            if due_hi == now_hi:
                return wheel[due_q - due_hi * size]
            due_q = due_hi
            now_q = now_hi
        return self._overflow

    def _push(self, bucket: _Bucket, key: str, stamp: int) -> None:
        if bucket.live == 0:
            bucket.least = stamp
            bucket.ordered = True
            self._masks[bucket.level] |= bucket.bit
        else:
            if bucket.ordered and stamp < bucket.stamps[-1]:
                bucket.ordered = False
            least = bucket.least
            if least is not None and stamp < least:
                bucket.least = stamp
        bucket.keys.append(key)
        bucket.stamps.append(stamp)
        bucket.live += 1

    def _discard(self, bucket: _Bucket, stamp: int) -> None:
        """One live entry of ``bucket`` (the one with ``stamp``) has just gone stale."""
        bucket.live -= 1
        if bucket.live == 0:
            bucket.reset()
            self._masks[bucket.level] &= ~bucket.bit
            return
        if bucket.least == stamp:
            bucket.least = None
        if len(bucket.stamps) - bucket.head > 2 * bucket.live + 16:
            self._compact(bucket)

    def _compact(self, bucket: _Bucket) -> None:
        """Drop stale entries, keeping order; the minimum becomes known."""
        index = self._index
        keys: list[str] = []
        stamps: list[int] = []
        for key, stamp in zip(
            bucket.keys[bucket.head :], bucket.stamps[bucket.head :], strict=True
        ):
            if index.get(key) == stamp:
                keys.append(key)
                stamps.append(stamp)
        bucket.keys = keys
        bucket.stamps = stamps
        bucket.head = 0
        bucket.least = stamps[0] if bucket.ordered else min(stamps)

    def _least(self, bucket: _Bucket) -> int:
        """The exact minimum live stamp of a non-empty bucket."""
        least = bucket.least
        if least is not None:
            return least
        index = self._index
        keys = bucket.keys
        stamps = bucket.stamps
        if bucket.ordered:
            head = bucket.head
            while index.get(keys[head]) != stamps[head]:
                head += 1
            if head > 32 and 2 * head > len(stamps):
                del keys[:head]
                del stamps[:head]
                head = 0
            bucket.head = head
            least = stamps[head]
        else:
            # Sort once so later minimum removals only walk forward.
            pairs = sorted(
                (stamp, key)
                for key, stamp in zip(keys[bucket.head :], stamps[bucket.head :], strict=True)
                if index.get(key) == stamp
            )
            bucket.keys = [key for _, key in pairs]
            bucket.stamps = [stamp for stamp, _ in pairs]
            bucket.head = 0
            bucket.ordered = True
            least = pairs[0][0]
        bucket.least = least
        return least

    def _detach(self, bucket: _Bucket) -> tuple[list[str], list[int], int]:
        """Empty ``bucket``, returning its entries (stale ones included) from ``head`` on."""
        keys, stamps, head = bucket.keys, bucket.stamps, bucket.head
        bucket.reset()
        self._masks[bucket.level] &= ~bucket.bit
        return keys, stamps, head

    def _take_all(self, bucket: _Bucket, out: list[str]) -> None:
        """Append every live key of ``bucket`` to ``out`` and empty it."""
        if bucket.live == 0:
            return
        index = self._index
        live = bucket.live
        keys, stamps, head = self._detach(bucket)
        if head == 0 and len(keys) == live:
            out.extend(keys)  # no stale entries
            return
        for i in range(head, len(keys)):
            key = keys[i]
            if index.get(key) == stamps[i]:
                out.append(key)

    def _split(self, bucket: _Bucket, now_ms: int, out: list[str]) -> None:
        """Set the time to ``now_ms``; keys of ``bucket`` due by then go to ``out``, the rest
        are placed again (a level lower, or back into the same level-0 bucket)."""
        index = self._index
        keys, stamps, head = self._detach(bucket)
        self._now = now_ms
        limit = (now_ms + 1) << _SEQ_BITS  # stamp < limit  <=>  due <= now_ms
        for i in range(head, len(keys)):
            key = keys[i]
            stamp = stamps[i]
            if index.get(key) != stamp:
                continue
            if stamp < limit:
                out.append(key)
            else:
                self._push(self._locate(stamp >> _SEQ_BITS), key, stamp)

    def _sweep(self, now_ms: int, out: list[str]) -> None:
        """Collect everything due by ``now_ms`` (> current time) and move the time there.

        Visits only non-empty buckets, earliest first, so an idle gap of any length costs
        nothing.  Positions are computed from the old time until the last bucket is split.
        """
        now = self._now
        masks = self._masks
        units = self._units
        while True:
            for level in range(self._levels):
                mask = masks[level]
                if mask:
                    break
            else:
                overflow = self._overflow
                top = units[self._levels]
                if overflow.live and (now // top + 1) * top <= now_ms:
                    self._split(overflow, now_ms, out)
                break
            slot = (mask & -mask).bit_length() - 1
            unit = units[level]
            block = units[level + 1]
            start = (now // block) * block + slot * unit
            if start > now_ms:
                break
            bucket = self._wheels[level][slot]
            if start + unit - 1 <= now_ms:
                self._take_all(bucket, out)  # the whole bucket is due
                continue
            self._split(bucket, now_ms, out)
            break
        self._now = now_ms

    def _stored_entries(self) -> int:
        """Bucket entries held, stale ones included, also those before a bucket's ``head``
        (for tests: moves must not leak)."""
        buckets = [b for wheel in self._wheels for b in wheel] + [self._ready, self._overflow]
        return sum(len(b.keys) for b in buckets)
