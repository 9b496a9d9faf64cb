"""A backup of several shards (schedd.storage.bundle): one tar file of every shard's image,
read back whole; a file that is no bundle, or one that lacks a shard, is refused in one line
naming what is wrong."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import orjson
import pytest

from schedd.storage.bundle import bundle_shards, is_bundle, unpack_bundle, write_bundle
from schedd.storage.snapshots import SnapshotError, verify_image

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "snapshot-image-v1.snap"


def test_a_bundle_holds_each_shards_image_whole(tmp_path: Path) -> None:
    images = []
    for k in range(3):
        images.append(tmp_path / f"in-{k}.snap")
        images[-1].write_bytes(SAMPLE.read_bytes())
    dest = tmp_path / "b.snap"
    write_bundle(dest, images)
    assert is_bundle(dest) and not is_bundle(SAMPLE)
    assert bundle_shards(dest) == 3
    out = tmp_path / "out"
    out.mkdir()
    back = unpack_bundle(dest, out)
    assert [p.name for p in back] == ["shard-0.snap", "shard-1.snap", "shard-2.snap"]
    assert all(p.read_bytes() == SAMPLE.read_bytes() for p in back)
    assert verify_image(back[2]).header == verify_image(SAMPLE).header
    with tarfile.open(dest) as tar:  # a plain tar: `tar tvf` lists it
        assert tar.getnames() == ["cluster.json", "shard-0.snap", "shard-1.snap", "shard-2.snap"]


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ({"other.txt": b"x"}, "without a readable cluster.json"),
        ({"cluster.json": b"{nope"}, "without a readable cluster.json"),
        ({"cluster.json": orjson.dumps({"format": 2, "shards": 3})}, "another format"),
        ({"cluster.json": orjson.dumps({"format": 1, "shards": 1})}, "another format"),
        ({"cluster.json": orjson.dumps([1])}, "another format"),
        (
            {"cluster.json": orjson.dumps({"format": 1, "shards": 2}), "shard-0.snap": b"x"},
            "without shard-1.snap",
        ),
    ],
)
def test_what_is_not_a_whole_bundle_is_refused_naming_why(
    tmp_path: Path, members: dict[str, bytes], said: str
) -> None:
    path = _tar(tmp_path / "bad.snap", members)
    assert is_bundle(path)
    with pytest.raises(SnapshotError, match=said):
        out = tmp_path / "out"
        out.mkdir()
        unpack_bundle(path, out)
