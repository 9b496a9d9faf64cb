"""Unit tests of the leader's timing wheel (schedd.core.wheel)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from schedd.core.wheel import TimingWheel

T0 = 1_700_000_000_000  # a realistic "now" in epoch milliseconds
SEC = 1_000
DAY = 86_400_000
YEAR = 365 * DAY

# An op is ("add", key, due), ("remove", key) or ("advance", now); each advance's result is
# checked against the next entry of the expected list.
Op = tuple[Any, ...]

CASES: list[tuple[str, dict[str, int], int, list[Op], list[list[str]]]] = [
    (
        "past due comes out on the next advance, even without time moving",
        {},
        T0,
        [("add", "a", T0 - 5 * SEC), ("add", "b", T0), ("advance", T0), ("advance", T0)],
        [["a", "b"], []],
    ),
    (
        "past due comes out even when the next advance goes backwards",
        {},
        T0,
        [("add", "a", T0 - 1), ("advance", T0 - DAY), ("advance", T0 + 1)],
        [["a"], []],
    ),
    (
        "ordered by due time, ties by insertion order",
        {},
        T0,
        [
            ("add", "b", T0 + 1500),
            ("add", "a", T0 + 1500),
            ("add", "c", T0 + 1200),
            ("add", "p", T0 - 1),
            ("advance", T0 + 2000),
        ],
        [["p", "c", "b", "a"]],
    ),
    (
        "ties across buckets and levels still follow insertion order",
        {"tick_ms": 1, "wheel_size": 4, "levels": 2},
        0,
        [
            ("add", "x", 13),  # level 1 while now=0
            ("advance", 12),  # cascades x into level 0
            ("add", "y", 13),  # straight into level 0, after x
            ("add", "w", 13),
            ("advance", 13),
        ],
        [[], ["x", "y", "w"]],
    ),
    (
        "re-adding with the same due counts as a fresh insertion",
        {},
        T0,
        [
            ("add", "a", T0 + 100),
            ("add", "b", T0 + 100),
            ("add", "a", T0 + 100),
            ("advance", T0 + 100),
        ],
        [["b", "a"]],
    ),
    (
        "move later: not returned at the old due",
        {},
        T0,
        [
            ("add", "a", T0 + 100),
            ("add", "a", T0 + 5 * SEC),
            ("advance", T0 + 100),
            ("advance", T0 + 5 * SEC),
        ],
        [[], ["a"]],
    ),
    (
        "move earlier: returned at the new due, once",
        {},
        T0,
        [
            ("add", "a", T0 + DAY),
            ("add", "a", T0 + 100),
            ("advance", T0 + 100),
            ("advance", T0 + DAY),
        ],
        [["a"], []],
    ),
    (
        "move into the past and back into the future",
        {},
        T0,
        [
            ("add", "a", T0 + 100),
            ("add", "a", T0 - 100),
            ("add", "a", T0 + 200),
            ("advance", T0 + 199),
            ("advance", T0 + 200),
        ],
        [[], ["a"]],
    ),
    (
        "remove",
        {},
        T0,
        [("add", "a", T0 + 100), ("add", "b", T0 + 100), ("remove", "a"), ("advance", T0 + DAY)],
        [["b"]],
    ),
    (
        "remove a past-due key",
        {},
        T0,
        [("add", "a", T0 - 100), ("remove", "a"), ("advance", T0)],
        [[]],
    ),
    (
        "remove then add again",
        {},
        T0,
        [
            ("add", "a", T0 + 100),
            ("remove", "a"),
            ("add", "a", T0 + 300),
            ("advance", T0 + 200),
            ("advance", T0 + 300),
        ],
        [[], ["a"]],
    ),
    (
        "exact within a tick: a key due later in the current tick waits",
        {"tick_ms": 10},
        T0,
        [
            ("add", "a", T0 + 3),
            ("add", "b", T0 + 7),
            ("advance", T0 + 5),
            ("advance", T0 + 6),
            ("advance", T0 + 7),
        ],
        [["a"], [], ["b"]],
    ),
    (
        "due exactly at the new time is due, one past it is not",
        {},
        T0,
        [
            ("add", "a", T0 + 640),
            ("add", "b", T0 + 641),
            ("advance", T0 + 640),
            ("advance", T0 + 641),
        ],
        [["a"], ["b"]],
    ),
    (
        "due on the last millisecond of a tick: not due one millisecond before",
        {"tick_ms": 10},
        T0,
        [("add", "a", T0 + 9), ("advance", T0 + 8), ("advance", T0 + 9)],
        [[], ["a"]],
    ),
    (
        "an advance landing on the first millisecond of the next tick drains both ticks",
        {"tick_ms": 10},
        T0,
        [("add", "a", T0 + 5), ("add", "b", T0 + 10), ("add", "c", T0 + 11), ("advance", T0 + 10)],
        [["a", "b"]],
    ),
    (
        # 2**53 + 63 is odd and above 2**53: a float cannot hold it (it rounds to 2**53 + 64,
        # the start of the next 64 ms block), so the wheel must place keys with integers only.
        "times beyond a float's 53 bits are still exact",
        {"tick_ms": 1, "wheel_size": 64, "levels": 2},
        2**53 + 63,
        [("add", "a", 2**53 + 69), ("advance", 2**53 + 64), ("advance", 2**53 + 69)],
        [[], ["a"]],
    ),
    (
        "a year away (beyond every level) still comes out on time",
        {},
        T0,
        [
            ("add", "far", T0 + YEAR),
            ("add", "near", T0 + SEC),
            ("advance", T0 + YEAR - DAY),
            ("advance", T0 + YEAR - 1),
            ("advance", T0 + YEAR),
        ],
        [["near"], [], ["far"]],
    ),
    (
        "far future on a tiny wheel: overflow re-placed many times",
        {"tick_ms": 1, "wheel_size": 2, "levels": 1},
        0,
        [
            ("add", "a", 1_000),
            ("add", "b", 37),
            *[("advance", t) for t in range(0, 1_000, 7)],
            ("advance", 999),
            ("advance", 1_000),
        ],
        [["b"] if t == 42 else [] for t in range(0, 1_000, 7)] + [[], ["a"]],
    ),
    (
        "big jumps: a day, then ten years",
        {},
        T0,
        [
            ("add", "a", T0 + 10),
            ("add", "b", T0 + 3 * DAY),
            ("add", "c", T0 + 20 * YEAR),
            ("advance", T0 + DAY),
            ("advance", T0 + 10 * YEAR),
            ("advance", T0 + 30 * YEAR),
        ],
        [["a"], ["b"], ["c"]],
    ),
    (
        "one big jump drains every level in order",
        {},
        T0,
        [
            ("add", "y", T0 + YEAR),
            ("add", "h", T0 + 3_600_000),
            ("add", "s", T0 + SEC),
            ("add", "t", T0 + 1),
            ("add", "m", T0 + 60_000),
            ("advance", T0 + 2 * YEAR),
        ],
        [["t", "s", "m", "h", "y"]],
    ),
    (
        "now going backwards is a no-op that returns only keys already due",
        {},
        T0,
        [
            ("add", "a", T0 + 500),
            ("advance", T0 + 1_000),
            ("add", "late", T0 + 900),  # already due at the wheel's time
            ("add", "soon", T0 + 1_001),
            ("advance", T0 + 800),
            ("advance", T0 + 999),
            ("advance", T0 + 1_001),
        ],
        [["a"], ["late"], [], ["soon"]],
    ),
    (
        "negative and zero times",
        {"tick_ms": 3, "wheel_size": 4, "levels": 2},
        -100,
        [
            ("add", "a", -50),
            ("add", "b", 0),
            ("add", "c", -101),
            ("advance", -51),
            ("advance", -1),
            ("advance", 0),
        ],
        [["c"], ["a"], ["b"]],
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "start", "ops", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_scenarios(
    kwargs: dict[str, int], start: int, ops: list[Op], expected: list[list[str]]
) -> None:
    wheel = TimingWheel(start, **kwargs)
    results: list[list[str]] = []
    for op in ops:
        if op[0] == "add":
            wheel.add(op[1], op[2])
        elif op[0] == "remove":
            wheel.remove(op[1])
        else:
            results.append(wheel.advance(op[1]))
    assert results == expected


@pytest.mark.parametrize(
    ("ops", "expected_next"),
    [
        ([], None),
        ([("add", "a", T0 + 100)], T0 + 100),
        ([("add", "a", T0 + 100), ("add", "b", T0 + 50)], T0 + 50),
        ([("add", "a", T0 + 100), ("add", "b", T0 + 50), ("remove", "b")], T0 + 100),
        ([("add", "a", T0 + 100), ("add", "a", T0 + 7)], T0 + 7),
        ([("add", "a", T0 + 7), ("add", "a", T0 + 100)], T0 + 100),
        ([("add", "a", T0 + YEAR)], T0 + YEAR),
        ([("add", "a", T0 + YEAR), ("add", "b", T0 - 3)], T0 - 3),
        ([("add", "a", T0 + 3), ("add", "b", T0 + 8), ("advance", T0 + 5)], T0 + 8),
        ([("add", "a", T0 + 3), ("advance", T0 + 5)], None),
        (
            [("add", "a", T0 + DAY + 1), ("add", "b", T0 + DAY + 2), ("advance", T0 + DAY)],
            T0 + DAY + 1,
        ),
        ([("add", "a", T0 + 1), ("remove", "a")], None),
    ],
)
def test_next_due_ms(ops: list[Op], expected_next: int | None) -> None:
    wheel = TimingWheel(T0)
    for op in ops:
        if op[0] == "add":
            wheel.add(op[1], op[2])
        elif op[0] == "remove":
            wheel.remove(op[1])
        else:
            wheel.advance(op[1])
    assert wheel.next_due_ms() == expected_next


def test_next_due_ms_is_exact_as_the_minimum_is_removed() -> None:
    wheel = TimingWheel(T0)
    dues = [T0 + 40_000 + 7 * i for i in range(500)]  # all in one coarse bucket
    shuffled = list(enumerate(dues))
    random.Random(3).shuffle(shuffled)
    for i, due in shuffled:
        wheel.add(f"k{i}", due)
    for i, due in enumerate(dues):
        assert wheel.next_due_ms() == due
        assert wheel.remove(f"k{i}")
    assert wheel.next_due_ms() is None


def test_contains_len_due_of_remove() -> None:
    wheel = TimingWheel(T0)
    assert len(wheel) == 0 and "a" not in wheel and wheel.due_of("a") is None
    wheel.add("a", T0 + 5)
    wheel.add("b", T0 + YEAR)
    wheel.add("a", T0 + 9)
    assert len(wheel) == 2
    assert "a" in wheel and "b" in wheel and "c" not in wheel
    assert 42 not in wheel and None not in wheel
    assert wheel.due_of("a") == T0 + 9
    assert wheel.due_of("b") == T0 + YEAR
    assert wheel.remove("a") is True
    assert wheel.remove("a") is False
    assert wheel.remove("never") is False
    assert len(wheel) == 1 and "a" not in wheel and wheel.due_of("a") is None


def test_clear_keeps_time_and_forgets_keys() -> None:
    wheel = TimingWheel(T0)
    for i in range(100):
        wheel.add(f"k{i}", T0 + i * 997 - 50)
    wheel.advance(T0 + 10)
    wheel.clear()
    assert len(wheel) == 0 and wheel.next_due_ms() is None and "k99" not in wheel
    assert wheel.advance(T0 + YEAR) == []
    wheel.add("again", T0 + 5)  # the wheel's time is now T0 + YEAR: already due
    assert wheel.advance(T0) == ["again"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tick_ms": 0}, "tick_ms must be at least 1, got 0"),
        ({"tick_ms": -1}, "tick_ms must be at least 1, got -1"),
        ({"wheel_size": 1}, "wheel_size must be at least 2, got 1"),
        ({"levels": 0}, "levels must be at least 1, got 0"),
    ],
)
def test_rejects_bad_shape_naming_the_argument(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        TimingWheel(T0, **kwargs)
    assert str(caught.value) == message


def test_idle_gap_does_not_walk_ticks() -> None:
    # With 1 ms ticks, walking tick by tick over 10**15 ms would never finish.
    wheel = TimingWheel(0, tick_ms=1, wheel_size=64, levels=5)
    wheel.add("a", 10**15)
    wheel.add("b", 5 * 10**14)
    wheel.add("c", 3)
    assert wheel.advance(10**14) == ["c"]
    assert wheel.next_due_ms() == 5 * 10**14
    assert wheel.advance(10**15 - 1) == ["b"]
    assert wheel.advance(10**16) == ["a"]


def test_repeated_moves_do_not_leak_entries() -> None:
    wheel = TimingWheel(T0)
    for i in range(100):
        wheel.add(f"k{i}", T0 + DAY + i)
    for n in range(20_000):
        wheel.add(f"k{n % 100}", T0 + DAY + n)  # lease renewals in a far bucket
        wheel.add("lone", T0 + YEAR + n)  # a lone key moving inside the overflow
    assert len(wheel) == 101
    assert wheel._stored_entries() <= 3 * len(wheel) + 64
    assert wheel.next_due_ms() == T0 + DAY + 19_900


def test_renewing_the_earliest_key_again_and_again_does_not_leak() -> None:
    # Leases renewed in turn, the leader asking for its next wake-up after each renewal: every
    # renewal leaves a dead entry at the front of one far bucket, which next_due_ms walks past.
    wheel = TimingWheel(T0)
    for i in range(50):
        wheel.add(f"lease{i}", T0 + DAY + i)
    for n in range(50, 20_050):
        wheel.add(f"lease{n % 50}", T0 + DAY + n)
        assert wheel.next_due_ms() == T0 + DAY + n - 49
    assert wheel._stored_entries() <= 3 * len(wheel) + 64
    assert wheel.advance(T0 + DAY + 20_049) == [f"lease{i}" for i in range(50)]


def test_minimum_survives_compaction_of_an_unordered_bucket() -> None:
    wheel = TimingWheel(T0)
    wheel.add("a", T0 + 50_000)
    wheel.add("b", T0 + 45_000)  # same coarse bucket, out of order
    for n in range(100):
        wheel.add("c", T0 + 60_000 + n)  # stale entries pile up until the bucket compacts
    assert wheel._stored_entries() < 100
    assert wheel.next_due_ms() == T0 + 45_000
    assert wheel.advance(T0 + 70_000) == ["b", "a", "c"]


def test_200k_keys_drain_in_order() -> None:
    rng = random.Random(7)
    n = 200_000
    # Half within the next hour (a few already due), half up to two years out.
    dues = [
        T0 - 1_000 + rng.randrange(3_601_000) if i % 2 else T0 + rng.randrange(2 * YEAR)
        for i in range(n)
    ]
    keys = [f"job-{i}" for i in range(n)]
    wheel = TimingWheel(T0)
    for key, due in zip(keys, dues, strict=True):
        wheel.add(key, due)
    assert len(wheel) == n
    out: list[str] = []
    now = T0
    while len(out) < n // 2:
        now += rng.randint(1, 30_000)
        out.extend(wheel.advance(now))
    out.extend(wheel.advance(T0 + 3 * YEAR))
    assert len(wheel) == 0 and wheel.next_due_ms() is None
    # A stable sort by due keeps insertion order among ties.
    assert out == [keys[i] for i in sorted(range(n), key=dues.__getitem__)]
