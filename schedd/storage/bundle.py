"""The backup of a cluster of several shards: one file that holds each shard's image.

A bundle is a POSIX tar archive (so ``tar tvf`` lists it) of ``cluster.json`` (``{"format":
1, "shards": N}``), first, then ``shard-0.snap`` ... ``shard-<N-1>.snap``, each a whole image
of that shard (``schedd.storage.snapshots``), checked when it was saved and again when it is
restored.  A cluster of one shard is backed up as a plain image, as before bundles existed.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import orjson

from schedd.storage.snapshots import SnapshotError

BUNDLE_FORMAT = 1
RECORD = "cluster.json"
_USTAR = b"ustar"  # at offset 257 of a tar archive's first block


def member(shard: int) -> str:
    return f"shard-{shard}.snap"


def is_bundle(path: Path) -> bool:
    """Whether the file at ``path`` is a tar archive (a bundle, or meant to be one)."""
    with open(path, "rb") as f:
        head = f.read(512)
    return len(head) == 512 and head[257:262] == _USTAR


def write_bundle(dest: Path, images: list[Path]) -> None:
    """Write the bundle of the shards' images (``images[k]``: shard k's) to ``dest``, synced."""
    record = orjson.dumps({"format": BUNDLE_FORMAT, "shards": len(images)})
    with open(dest, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            info = tarfile.TarInfo(RECORD)
            info.size, info.mode = len(record), 0o600
            tar.addfile(info, io.BytesIO(record))
            for shard, image in enumerate(images):
                info = tarfile.TarInfo(member(shard))
                info.size, info.mode = image.stat().st_size, 0o600
                with open(image, "rb") as f:
                    tar.addfile(info, f)
        raw.flush()
        os.fsync(raw.fileno())


def bundle_shards(path: Path) -> int:
    """How many shards the bundle at ``path`` holds (:class:`SnapshotError` when it is not a
    bundle of this format)."""
    with _open(path) as tar:
        return _record(path, tar)


def unpack_bundle(path: Path, into: Path) -> list[Path]:
    """Each shard's image of the bundle at ``path``, copied into the directory ``into``."""
    out = []
    with _open(path) as tar:
        shards = _record(path, tar)
        for shard in range(shards):
            name = member(shard)
            try:
                info = tar.getmember(name)
            except KeyError:
                raise SnapshotError(
                    f"{path}: a bundle of {shards} shards without {name}: not a whole backup"
                ) from None
            src = tar.extractfile(info) if info.isfile() else None
            if src is None:
                raise SnapshotError(f"{path}: {name} is not a file")
            target = into / name
            with src, open(target, "wb") as f:
                shutil.copyfileobj(src, f, 1 << 20)
            out.append(target)
    return out


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r:")
    except (tarfile.TarError, EOFError) as exc:
        raise SnapshotError(f"{path}: not a schedd backup ({exc})") from None


def _record(path: Path, tar: tarfile.TarFile) -> int:
    try:
        info = tar.getmember(RECORD)
        src = tar.extractfile(info)
        doc = orjson.loads(src.read() if src is not None else b"")
    except (KeyError, orjson.JSONDecodeError, tarfile.TarError):
        raise SnapshotError(
            f"{path}: a tar archive without a readable {RECORD}: not a schedd backup"
        ) from None
    shards = doc.get("shards") if isinstance(doc, dict) else None
    fmt = doc.get("format") if isinstance(doc, dict) else None
    if (
        fmt != BUNDLE_FORMAT
        or isinstance(shards, bool)
        or not isinstance(shards, int)
        or shards < 2
    ):
        raise SnapshotError(
            f"{path}: {RECORD} says {render(doc)}: a backup of another format (expected "
            f'{{"format": {BUNDLE_FORMAT}, "shards": N}}); restore it with the release that '
            "made it"
        )
    return shards


def render(doc: object) -> str:
    return orjson.dumps(doc).decode()[:200]
