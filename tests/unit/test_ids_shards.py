"""A job id says its shard: made with it, read back from the id, a run id or a prefix of it;
other texts are routed by a hash that every process agrees on."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from schedd import ids
from schedd.ids import (
    CROCKFORD,
    MAX_SHARDS,
    SHARD_CHAR,
    is_job_id,
    new_job_id,
    shard_of_id,
    shard_of_key,
)

T0 = 1_800_000_000_000


@pytest.fixture(autouse=True)
def own_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh id sequences: the ids these tests make at times of their own neither depend on
    the times other tests made ids at, nor move the process's sequences to those times."""
    monkeypatch.setattr(ids, "_job_ids", ids.Monotonic(80))
    monkeypatch.setattr(ids, "_sharded_ids", ids.Monotonic(ids._REST_BITS))


@pytest.mark.parametrize("shards", [2, 3, 7, MAX_SHARDS])
def test_an_id_made_in_a_shard_names_it_as_a_job_a_run_and_a_prefix(shards: int) -> None:
    for shard in range(shards):
        job_id = new_job_id(T0, shard)
        assert is_job_id(job_id) and job_id[SHARD_CHAR] == CROCKFORD[shard]
        assert shard_of_id(job_id, shards) == shard
        assert shard_of_id(f"{job_id}@{T0}", shards) == shard
        assert shard_of_id(job_id[: SHARD_CHAR + 1].lower(), shards) == shard
        assert shard_of_id(job_id[:SHARD_CHAR], shards) is None  # too short to say


def test_an_id_naming_no_shard_of_the_cluster_is_none() -> None:
    job_id = new_job_id(T0, 5)
    assert shard_of_id(job_id, 5) is None and shard_of_id(job_id, 6) == 5
    assert shard_of_id(job_id[:SHARD_CHAR] + "!" + job_id[SHARD_CHAR + 1 :], 8) is None


def test_one_shard_makes_the_ids_it_always_made_and_everything_is_in_it() -> None:
    ids = [new_job_id(T0) for _ in range(200)]
    assert {shard_of_id(i, 1) for i in ids} == {0} and len(set(ids)) == 200
    # the 11th character of ids made without a shard is random bits, as before
    assert len({new_job_id(T0 + k)[SHARD_CHAR] for k in range(1, 200)}) > 8


def test_the_ids_of_one_shard_count_up_within_a_millisecond() -> None:
    ids = [new_job_id(T0 + 5, 3) for _ in range(1_000)]
    assert ids == sorted(ids) and len(set(ids)) == 1_000
    assert {shard_of_id(i, 4) for i in ids} == {3}


def test_a_shard_outside_the_alphabet_is_refused() -> None:
    for bad in (-1, MAX_SHARDS):
        with pytest.raises(ValueError, match="shard"):
            new_job_id(T0, bad)


def test_keys_spread_over_the_shards_and_every_process_agrees() -> None:
    keys = [f"default\0invoice-{k}" for k in range(3_000)]
    counts = Counter(shard_of_key(k, 3) for k in keys)
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 900  # about 1,000 each
    assert {shard_of_key(k, 1) for k in keys} == {0}
    here = [shard_of_key(k, 7) for k in keys[:50]]
    code = (
        "import sys; from schedd.ids import shard_of_key; "
        "print(','.join(str(shard_of_key(f'default\\0invoice-{k}', 7)) for k in range(50)))"
    )
    # another interpreter, with another hash salt, routes every key alike
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PYTHONPATH": ":".join(sys.path)},
    ).stdout
    assert [int(x) for x in out.strip().split(",")] == here
