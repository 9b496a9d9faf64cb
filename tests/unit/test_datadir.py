"""The cluster record in a node's data directory: written once, read on every start, and a
config naming another number of shards refused with both numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schedd.config import load_config
from schedd.datadir import check_record, ensure_record, read_record, record_path


def config(data: Path, shards: int = 1) -> object:
    return load_config(
        None, env={}, overrides={"node.data_dir": str(data), "cluster.shards": shards}
    )


def test_a_new_data_dir_gets_the_configs_number_of_shards(tmp_path: Path) -> None:
    cfg = config(tmp_path / "d", shards=3)
    assert read_record(cfg) is None and check_record(cfg) == []
    assert ensure_record(cfg) == []
    assert json.loads(record_path(cfg).read_text()) == {"format": 1, "shards": 3}
    assert read_record(cfg) == 3
    assert ensure_record(cfg) == []  # once written, only read


def test_a_data_dir_from_before_the_record_holds_one_shard(tmp_path: Path) -> None:
    (tmp_path / "raft").mkdir()
    (tmp_path / "raft" / "state.db").write_bytes(b"")
    problems = check_record(config(tmp_path, shards=2))
    assert len(problems) == 1
    assert "created with shards = 1; this config says shards = 2" in problems[0]
    assert not record_path(config(tmp_path)).exists()
    cfg = config(tmp_path)
    assert ensure_record(cfg) == [] and read_record(cfg) == 1


def test_another_number_of_shards_is_refused_naming_both(tmp_path: Path) -> None:
    ensure_record(config(tmp_path, shards=4))
    (problem,) = ensure_record(config(tmp_path, shards=1))
    assert problem.startswith(f'cluster.shards: node.data_dir "{tmp_path}"')
    assert "created with shards = 4; this config says shards = 1" in problem
    assert "set [cluster] shards = 4" in problem
    assert read_record(config(tmp_path)) == 4  # the refusal changed nothing


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("{not json", "is not JSON"),
        ('["shards", 3]', "is not a cluster record"),
        ('{"format": 1, "shards": 0}', 'no valid "shards"'),
        ('{"format": 1, "shards": true}', 'no valid "shards"'),
        ('{"format": 2, "shards": 3}', "written by a newer schedd"),
    ],
)
def test_a_record_that_cannot_be_used_is_named(tmp_path: Path, body: str, says: str) -> None:
    (tmp_path / "cluster.json").write_text(body)
    (problem,) = ensure_record(config(tmp_path))
    assert problem.startswith(f'node.data_dir: "{tmp_path / "cluster.json"}"') and says in problem
    assert (tmp_path / "cluster.json").read_text() == body
