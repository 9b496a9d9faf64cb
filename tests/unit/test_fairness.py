"""Unit tests of lease fairness (schedd.core.fairness)."""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter

import pytest

from schedd.core.fairness import (
    DEFAULT_WEIGHTS,
    ConcurrencyCaps,
    ReadyQueues,
    TaskLanes,
    TokenBucket,
)
from schedd.core.model import Priority

H, N, L = Priority.HIGH, Priority.NORMAL, Priority.LOW
LETTER = {H: "h", N: "n", L: "l"}


def fill(q: ReadyQueues, namespace: str, priority: Priority, count: int, tag: str = "") -> None:
    for i in range(count):
        q.push(f"{namespace}{tag}/{LETTER[priority]}{i}", namespace, priority)


def lanes(q: ReadyQueues, pops: int) -> str:
    """The priority letter of each of the next ``pops`` runs."""
    out = []
    for _ in range(pops):
        run_id = q.pop()
        assert run_id is not None
        out.append(run_id.split("/")[1][0])
    return "".join(out)


def busy_queues(count: int = 10_000, weights: dict[Priority, int] | None = None) -> ReadyQueues:
    q = ReadyQueues(weights) if weights else ReadyQueues()
    for p in (H, N, L):
        fill(q, "ns", p, count)
    return q


# --- exact sequences ------------------------------------------------------------------------


def test_nginx_example_sequence() -> None:
    # nginx's own example: weights 5, 1, 1 give a a b a c a a.
    q = busy_queues(20, {H: 5, N: 1, L: 1})
    assert lanes(q, 14) == "hhnhlhh" * 2


def test_default_weights_first_hundred_pops() -> None:
    assert DEFAULT_WEIGHTS == {H: 70, N: 25, L: 5}
    q = busy_queues(200)
    first = lanes(q, 100)
    assert first[:20] == "hnhhhnhhlhnhhhnhhhnh"
    assert Counter(first) == {"h": 70, "n": 25, "l": 5}
    assert lanes(q, 100) == first  # the pattern repeats every 100 pops


def test_same_calls_same_answers() -> None:
    def script() -> list[str | None]:
        q = ReadyQueues()
        for i in range(50):
            q.push(f"r{i}", f"ns{i % 3}", (H, N, L)[i % 4 % 3])
            if i % 7 == 0:
                q.remove(f"r{i // 2}")
        return [q.pop() for _ in range(60)]

    assert script() == script()


def test_fifo_within_a_lane() -> None:
    q = ReadyQueues()
    for i in range(5):
        q.push(f"r{i}", "ns", N)
    assert [q.pop() for _ in range(6)] == ["r0", "r1", "r2", "r3", "r4", None]


def test_pop_on_empty_is_none() -> None:
    q = ReadyQueues()
    assert q.pop() is None and len(q) == 0 and not q


# --- priority weights -----------------------------------------------------------------------


def test_weights_over_10000_pops() -> None:
    q = busy_queues()
    counts = Counter(lanes(q, 10_000))
    for letter, share in (("h", 0.70), ("n", 0.25), ("l", 0.05)):
        assert abs(counts[letter] / 10_000 - share) <= 0.02
    assert counts == {"h": 7000, "n": 2500, "l": 500}  # in fact exact


def test_low_is_served_in_every_20_consecutive_pops() -> None:
    q = busy_queues()
    seq = lanes(q, 10_000)
    for start in range(len(seq) - 19):
        assert "l" in seq[start : start + 20], f"low starved at pops {start}..{start + 19}"


def test_low_is_not_starved_when_other_lanes_drain_and_refill_each_pop() -> None:
    # High and normal each hold a single run at a time and are refilled as soon as they are
    # popped; low has a backlog.  Low must still get its share.
    q = ReadyQueues()
    fill(q, "ns", L, 2_000)
    counter = itertools.count()
    q.push(f"ns/h{next(counter)}", "ns", H)
    q.push(f"ns/n{next(counter)}", "ns", N)
    seq = []
    for _ in range(10_000):
        run_id = q.pop()
        assert run_id is not None
        letter = run_id.split("/")[1][0]
        seq.append(letter)
        if letter in "hn":
            q.push(f"ns/{letter}{next(counter)}", "ns", H if letter == "h" else N)
    text = "".join(seq)
    counts = Counter(text)
    assert counts == {"h": 7000, "n": 2500, "l": 500}
    assert all("l" in text[i : i + 20] for i in range(len(text) - 19))


def test_an_empty_lanes_share_goes_to_the_others() -> None:
    q = ReadyQueues()
    fill(q, "ns", H, 10_000)
    fill(q, "ns", L, 10_000)
    counts = Counter(lanes(q, 7_500))
    assert counts == {"h": 7000, "l": 500}  # 70:5 of 75

    q = ReadyQueues()
    fill(q, "ns", N, 1_000)
    fill(q, "ns", L, 1_000)
    assert Counter(lanes(q, 300)) == {"n": 250, "l": 50}  # 25:5 of 30

    q = ReadyQueues()
    fill(q, "ns", L, 3)
    assert lanes(q, 3) == "lll"  # alone, low gets everything


def test_a_lane_that_empties_mid_way_gives_up_its_share() -> None:
    q = ReadyQueues()
    fill(q, "ns", H, 10)
    fill(q, "ns", N, 1_000)
    fill(q, "ns", L, 1_000)
    seq = lanes(q, 1_000)
    assert seq.count("h") == 10
    rest = Counter(seq[seq.rindex("h") + 1 :])
    assert abs(rest["n"] / (rest["n"] + rest["l"]) - 25 / 30) < 0.01


def test_custom_weights() -> None:
    q = busy_queues(100, {H: 1, N: 1, L: 1})
    assert lanes(q, 6) == "hnlhnl"


WEIGHTS_NEEDED = "weights: every weight must be an integer >= 1"
QUANTUM_NEEDED = "quantum: must be an integer >= 1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": {H: 1, N: 1}}, "weights: missing low"),
        ({"weights": {H: 1}}, "weights: missing normal, low"),
        ({"weights": {H: 1, N: 0, L: 1}}, WEIGHTS_NEEDED),
        ({"weights": {H: 1, N: 2.5, L: 1}}, WEIGHTS_NEEDED),
        ({"weights": {H: 1, N: True, L: 1}}, WEIGHTS_NEEDED),
        ({"quantum": 0}, QUANTUM_NEEDED),
        ({"quantum": 1.5}, QUANTUM_NEEDED),
        ({"quantum": True}, QUANTUM_NEEDED),
    ],
)
def test_ready_queues_reject_bad_weights_and_quantum(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        ReadyQueues(**kwargs)
    assert str(caught.value) == message


# --- namespaces -----------------------------------------------------------------------------


def test_namespaces_with_unequal_backlogs_get_equal_service() -> None:
    q = ReadyQueues()
    fill(q, "big", N, 10_000)
    fill(q, "small", N, 100)
    served = [q.pop() for _ in range(200)]
    assert all(r is not None for r in served)
    namespaces = [r.split("/")[0] for r in served if r]
    assert namespaces == ["big", "small"] * 100
    # Once small is done, big gets everything.
    assert all((r or "").startswith("big/") for r in (q.pop() for _ in range(50)))


def test_namespace_share_is_independent_of_priority_mix() -> None:
    # A namespace with only high runs does not beat one with only low runs: fairness between
    # namespaces comes first, priorities only order runs within a namespace.
    q = ReadyQueues()
    fill(q, "loud", H, 1_000)
    fill(q, "quiet", L, 1_000)
    namespaces = Counter((q.pop() or "").split("/")[0] for _ in range(1_000))
    assert namespaces == {"loud": 500, "quiet": 500}


def test_quantum() -> None:
    q = ReadyQueues(quantum=3)
    fill(q, "a", N, 10)
    fill(q, "b", N, 4)
    namespaces = "".join((q.pop() or "?")[0] for _ in range(14))
    assert namespaces == "aaabbbaaabaaaa"


def test_new_namespace_joins_at_the_back() -> None:
    q = ReadyQueues()
    fill(q, "a", N, 5)
    fill(q, "b", N, 5)
    assert q.pop() == "a/n0"
    fill(q, "c", N, 5)
    assert [q.pop() for _ in range(4)] == ["b/n0", "a/n1", "c/n0", "b/n1"]


def test_a_namespace_at_its_cap_is_skipped_and_resumes_when_released() -> None:
    q = ReadyQueues()
    caps = ConcurrencyCaps({"a": 2})
    fill(q, "a", N, 10)
    fill(q, "b", N, 10)

    def lease() -> str | None:
        run_id = q.pop(caps.can_take)
        if run_id is not None:
            assert caps.acquire(run_id.split("/")[0])
        return run_id

    assert [lease() for _ in range(6)] == ["a/n0", "b/n0", "a/n1", "b/n1", "b/n2", "b/n3"]
    assert caps.in_use("a") == 2 and not caps.can_take("a")
    caps.release("a")
    assert [lease() for _ in range(3)] == ["a/n2", "b/n4", "b/n5"]
    # Everyone capped: nothing is leased and nothing is lost.
    caps.update({"a": 0, "b": 0})
    before = len(q)
    assert q.pop(caps.can_take) is None and len(q) == before
    caps.update({"a": 0})
    assert q.pop(caps.can_take) == "b/n6"


def test_can_take_is_asked_once_per_namespace_when_all_say_no() -> None:
    q = ReadyQueues()
    for ns in "abc":
        fill(q, ns, N, 3)
    asked: list[str] = []

    def never(ns: str) -> bool:
        asked.append(ns)
        return False

    assert q.pop(never) is None
    assert sorted(asked) == ["a", "b", "c"]
    assert [q.pop() for _ in range(3)] == ["a/n0", "b/n0", "c/n0"]  # order kept


def test_concurrency_caps() -> None:
    caps = ConcurrencyCaps({"a": 1, "z": 0})
    assert caps.can_take("unlisted") and caps.acquire("unlisted") and caps.acquire("unlisted")
    assert caps.in_use("unlisted") == 2
    assert not caps.can_take("z") and not caps.acquire("z")
    assert caps.acquire("a") and not caps.acquire("a") and caps.in_use("a") == 1
    caps.release("a")
    caps.release("a")  # one too many: ignored
    assert caps.in_use("a") == 0 and caps.acquire("a")
    for bad in (-1, 1.5):
        with pytest.raises(ValueError) as caught:
            ConcurrencyCaps({"ok": 3, "a": bad})
        assert str(caught.value) == "concurrency cap for 'a': must be an integer >= 0"


# --- remove ---------------------------------------------------------------------------------


def test_remove_then_pop_never_returns_a_removed_id() -> None:
    q = ReadyQueues()
    for i in range(100):
        q.push(f"r{i}", f"ns{i % 3}", (H, N, L)[i % 3])
    removed = {f"r{i}" for i in range(0, 100, 3)} | {"r1", "r2", "r99"}
    for run_id in sorted(removed):
        assert q.remove(run_id)
        assert run_id not in q
    assert not q.remove("r0") and not q.remove("never-pushed")
    assert len(q) == 100 - len(removed)
    popped = []
    while (got := q.pop()) is not None:
        popped.append(got)
    assert not set(popped) & removed
    assert sorted(popped) == sorted(f"r{i}" for i in range(100) if f"r{i}" not in removed)
    assert len(q) == 0 and q.depth() == {}


def test_repush_after_remove_goes_to_the_back_and_pops_once() -> None:
    q = ReadyQueues()
    for run_id in ("a", "b", "c"):
        q.push(run_id, "ns", N)
    q.remove("a")
    q.push("a", "ns", N)
    q.remove("a")
    q.push("a", "ns", N)
    assert [q.pop() for _ in range(4)] == ["b", "c", "a", None]


def test_repush_in_another_lane() -> None:
    q = ReadyQueues()
    q.push("x", "ns", L)
    q.push("y", "ns", L)
    q.remove("x")
    q.push("x", "other", H)
    assert q.depth() == {("ns", L): 1, ("other", H): 1}
    popped = [q.pop(), q.pop()]
    assert sorted(r for r in popped if r is not None) == ["x", "y"]
    assert q.pop() is None


def test_push_of_a_queued_id_is_a_no_op() -> None:
    q = ReadyQueues()
    q.push("r", "ns", L)
    q.push("r", "ns", H)
    q.push("r", "other", N)
    assert len(q) == 1 and q.depth() == {("ns", L): 1}


def test_remove_does_not_leak() -> None:
    q = ReadyQueues()
    q.push("keep", "ns", N)
    for _ in range(10_000):
        q.push("churn", "ns", N)
        q.remove("churn")
    lane = q._namespaces["ns"].lanes[1]  # white-box: memory is bounded
    assert len(lane.ids) <= 3 and lane.stale_total <= 1
    assert [q.pop(), q.pop()] == ["keep", None]


def test_many_namespaces_do_not_leak() -> None:
    q = ReadyQueues()
    for i in range(10_000):
        q.push(f"r{i}", f"ns{i}", N)
        assert q.pop() == f"r{i}"
    assert len(q._namespaces) <= 65  # white-box: idle namespaces are swept


def test_depth_and_len() -> None:
    q = ReadyQueues()
    fill(q, "a", H, 3)
    fill(q, "a", L, 1)
    fill(q, "b", N, 2)
    assert q.depth() == {("a", H): 3, ("a", L): 1, ("b", N): 2}
    assert len(q) == 6 and "a/h0" in q and "zzz" not in q and 42 not in q
    q.remove("a/l0")
    assert q.depth() == {("a", H): 3, ("b", N): 2}


def test_depth_lists_namespaces_by_name_then_priority_high_first() -> None:
    q = ReadyQueues()
    fill(q, "m", N, 1)
    assert q.pop() == "m/n0"  # m drains and leaves the ring
    for i in range(100):  # enough namespaces come and go for idle ones to be swept
        fill(q, f"tmp{i}", N, 1)
        assert q.pop() == f"tmp{i}/n0"
    fill(q, "z", L, 1)
    fill(q, "z", H, 2)
    fill(q, "m", N, 1)
    fill(q, "b", L, 1)
    assert list(q.depth().items()) == [
        (("b", L), 1),
        (("m", N), 1),
        (("z", H), 2),
        (("z", L), 1),
    ]


def test_pop_without_can_take_takes_from_any_namespace() -> None:
    q = ReadyQueues()
    fill(q, "a", N, 1)
    fill(q, "b", N, 1)
    assert [q.pop(None), q.pop(None), q.pop(None)] == ["a/n0", "b/n0", None]


def _push_and_pop_all(n: int) -> float:
    q = ReadyQueues()
    ids = [f"job{i}@{i}" for i in range(n)]
    prios = (H, N, L)
    namespaces = [f"ns{i}" for i in range(10)]
    start = time.perf_counter()
    for i, run_id in enumerate(ids):
        q.push(run_id, namespaces[i % 10], prios[i % 3])
    popped = 0
    while q.pop() is not None:
        popped += 1
    elapsed = time.perf_counter() - start
    assert popped == n
    return elapsed


def test_pushes_and_pops_cost_the_same_each_at_a_million_as_at_a_hundred_thousand() -> None:
    # Linear, not quadratic: ten times the runs take about ten times as long (a pop that
    # scanned the queue would take a hundred times).  A ratio, not a time, so it holds on a
    # loaded machine or under a tracer (scripts/mutants), which slow both sizes alike.
    small = min(_push_and_pop_all(100_000) for _ in range(3))
    big = _push_and_pop_all(1_000_000)
    assert big < 30 * small, f"1,000,000 took {big:.2f}s, 100,000 took {small:.2f}s"


# --- token bucket ---------------------------------------------------------------------------

T0 = 1_700_000_000_000


def test_token_bucket_burst_then_retry_after() -> None:
    b = TokenBucket(rate_per_s=2.0, burst=3)
    assert [b.take(T0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(T0) == pytest.approx(0.5)  # one token comes every 0.5 s
    assert b.take(T0, n=2) == pytest.approx(1.0)
    assert b.take(T0 + 250) == pytest.approx(0.25)  # half a token there already
    assert b.take(T0 + 500) == 0.0
    assert b.take(T0 + 500) == pytest.approx(0.5)


def test_token_bucket_refill_is_capped_at_burst() -> None:
    b = TokenBucket(rate_per_s=10.0, burst=5)
    assert b.take(T0, n=5) == 0.0
    assert b.available(T0 + 3_600_000) == pytest.approx(5.0)
    assert b.take(T0 + 3_600_000, n=5) == 0.0
    assert b.take(T0 + 3_600_000) == pytest.approx(0.1)


def test_token_bucket_refused_take_takes_nothing() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=2)
    assert b.take(T0, n=2) == 0.0
    for _ in range(5):
        assert b.take(T0 + 500) == pytest.approx(0.5)
    assert b.take(T0 + 1_000) == 0.0


def test_token_bucket_time_going_backwards_refills_nothing() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=1)
    assert b.take(T0) == 0.0
    assert b.take(T0 - 10_000) == pytest.approx(1.0)
    assert b.take(T0 + 999) == pytest.approx(0.001)
    assert b.take(T0 + 1_000) == 0.0


def test_token_bucket_more_than_burst_is_never_allowed() -> None:
    b = TokenBucket(rate_per_s=100.0, burst=10)
    assert b.take(T0, n=11) == math.inf
    assert b.take(T0, n=10) == 0.0  # the refused request took nothing


def test_token_bucket_slow_rate() -> None:
    b = TokenBucket(rate_per_s=1 / 60, burst=1)  # one a minute
    assert b.take(T0) == 0.0
    assert b.take(T0 + 30_000) == pytest.approx(30.0)


def test_token_bucket_taking_zero_tokens_is_allowed_and_takes_nothing() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=1)
    assert b.take(T0, n=0) == 0.0
    assert b.take(T0) == 0.0  # the one token was still there
    assert b.take(T0, n=0) == 0.0  # even with none left


RATE_NEEDED = "rate_per_s: must be a finite number > 0"


@pytest.mark.parametrize(
    ("rate", "burst", "message"),
    [
        (0.0, 1, RATE_NEEDED),
        (-1.0, 1, RATE_NEEDED),
        (math.nan, 1, RATE_NEEDED),
        (math.inf, 1, RATE_NEEDED),
        (1.0, 0, "burst: must be an integer >= 1"),
        (1.0, 1.5, "burst: must be an integer >= 1"),
    ],
)
def test_token_bucket_rejects_bad_arguments(rate: float, burst: int, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        TokenBucket(rate, burst)
    assert str(caught.value) == message


def test_token_bucket_rejects_a_negative_take() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=1)
    with pytest.raises(ValueError) as caught:
        b.take(T0, n=-1)
    assert str(caught.value) == "n: must be >= 0"
    assert b.take(T0) == 0.0  # the refused call took nothing


# -- tasks of one queue --------------------------------------------------------------------------


def test_task_lanes_give_a_worker_only_the_tasks_it_serves() -> None:
    q = TaskLanes()
    q.push("m1", "mail", "ns", Priority.HIGH)
    q.push("r1", "reports", "ns", Priority.LOW)
    q.push("m2", "mail", "ns", Priority.NORMAL)
    assert q.pop(frozenset({"reports"})) == "r1"
    assert q.pop(frozenset({"reports"})) is None  # mail waits, for a worker that runs it
    assert q.tasks() == ["mail"] and len(q) == 2
    assert q.pop(frozenset({"other"})) is None
    assert [q.pop(None), q.pop(None), q.pop(None)] == ["m1", "m2", None]
    assert not q and q.tasks() == []


def test_task_lanes_with_one_task_pop_as_its_ready_queues_does() -> None:
    q, ref = TaskLanes(), ReadyQueues()
    for i, (ns, p) in enumerate(itertools.product(("a", "b"), tuple(Priority))):
        for k in range(5):
            q.push(f"{ns}{p.value}{k}", "t", ns, p)
            ref.push(f"{ns}{p.value}{k}", ns, p)
        assert i < 6
    assert [q.pop() for _ in range(31)] == [ref.pop() for _ in range(31)]


def test_tasks_share_a_worker_by_the_weight_of_their_most_urgent_run() -> None:
    q = TaskLanes()
    for k in range(200):
        q.push(f"h{k}", "urgent", "ns", Priority.HIGH)
        q.push(f"l{k}", "bulk", "ns", Priority.LOW)
    got = Counter(q.pop(None)[0] for _ in range(150))  # type: ignore[index]
    # high weighs 70 and low 5: about 14 to 1, and the low task is never starved
    assert got["l"] == 10 and got["h"] == 140


def test_a_task_held_back_by_its_namespace_cap_uses_no_turn() -> None:
    q = TaskLanes()
    q.push("a1", "t1", "capped", Priority.HIGH)
    q.push("b1", "t2", "free", Priority.HIGH)
    q.push("b2", "t2", "free", Priority.HIGH)
    assert q.pop(None, lambda ns: ns != "capped") == "b1"
    assert q.pop(None, lambda ns: ns != "capped") == "b2"
    assert q.pop(None, lambda ns: ns != "capped") is None
    assert q.pop(None) == "a1"
    assert q.depth() == {}


def test_task_lanes_depth_and_removal() -> None:
    q = TaskLanes()
    q.push("a", "t1", "ns", Priority.HIGH)
    q.push("b", "t2", "ns", Priority.HIGH)
    q.push("c", "t2", "other", Priority.LOW)
    q.push("c", "t2", "other", Priority.LOW)  # already queued: no-op
    assert q.depth() == {("ns", Priority.HIGH): 2, ("other", Priority.LOW): 1}
    assert q.remove("b") and not q.remove("b") and "b" not in q and "c" in q
    assert q.remove("a") and q.tasks() == ["t2"]


def test_the_top_priority_follows_removals_and_pops() -> None:
    q = ReadyQueues()
    assert q.top_priority() is None
    fill(q, "a", H, 3)
    fill(q, "b", N, 1)
    assert q.top_priority() is H
    assert q.remove("a/h0") and q.remove("a/h1")
    assert q.top_priority() is H  # one high run still queued
    assert q.remove("a/h2")
    assert q.top_priority() is N
    assert q.pop() == "b/n0"
    assert q.top_priority() is None
