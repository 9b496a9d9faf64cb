"""schedd/gcpolicy.py: frozen objects are out of the collector's reach, a thaw finds the cyclic
garbage among them, and collections are timed."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from schedd.gcpolicy import GcPolicy


class Rec:
    """A tracked object, like the state's records."""

    __slots__ = ("ref",)

    def __init__(self, ref: object = None) -> None:
        self.ref = ref


@pytest.fixture
def clean_gc() -> Iterator[None]:
    gc.collect()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.collect()


def _in_generations(obj: object) -> bool:
    return any(o is obj for g in range(3) for o in gc.get_objects(generation=g))


def test_freeze_moves_live_objects_out_of_every_generation(clean_gc: None) -> None:
    records = [Rec() for _ in range(1000)]
    assert _in_generations(records[0])
    before = gc.get_freeze_count()
    GcPolicy.freeze()
    assert gc.get_freeze_count() >= before + len(records)
    assert not _in_generations(records[0])  # a full collection no longer walks it
    newer = Rec()
    assert _in_generations(newer)  # what comes after the freeze is collected as usual


def test_thaw_collects_cyclic_garbage_that_died_while_frozen(clean_gc: None) -> None:
    policy = GcPolicy(10, 3600)
    a, b = Rec(), Rec()
    a.ref, b.ref = b, a
    GcPolicy.freeze()
    del a, b  # a cycle: reference counting cannot free it, and the collector does not see it
    assert gc.collect() == 0
    assert policy.thaw() >= 2
    assert policy.thaws == 1 and policy.last_thaw_collected >= 2
    assert gc.get_freeze_count() > 0  # frozen again afterwards


def test_collections_are_timed_with_what_they_found(clean_gc: None) -> None:
    seen: list[tuple[int, float, int]] = []
    policy = GcPolicy(10, 3600, observe=lambda g, s, n: seen.append((g, s, n)))
    policy.install()
    try:
        garbage = [Rec() for _ in range(300_000)]
        for r in garbage:
            r.ref = r  # self-cycles: only the collector frees them
        # no automatic collection from here: one set off by an allocation below (the float of
        # perf_counter) could free the youngest of them before the explicit one counts them
        gc.disable()
        del garbage, r
        t0 = time.perf_counter()
        found = gc.collect()
        wall = time.perf_counter() - t0
    finally:
        gc.enable()
        policy.uninstall()
    gen2 = [s for s in seen if s[0] == 2]
    assert gen2 and gen2[-1][2] == found >= 300_000
    assert 0 < gen2[-1][1] <= wall
    assert policy._callback not in gc.callbacks


def test_install_collects_the_young_generation_less_often_and_uninstall_restores() -> None:
    from schedd.gcpolicy import YOUNG_THRESHOLD

    before = gc.get_threshold()
    policy = GcPolicy(10, 3600)
    policy.install()
    try:
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        policy.install()  # twice: still restores the original
    finally:
        policy.uninstall()
    assert gc.get_threshold() == before
