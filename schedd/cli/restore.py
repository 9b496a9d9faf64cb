"""``schedd restore --from FILE --config PATH``: seed this node of a new cluster from a backup.

The image (``schedctl snapshot save``) is checked whole and its state written into the node's
empty ``<node.data_dir>/raft`` (:func:`schedd.raft.snapshots.restore_data_dir`), with a Raft log
that starts at the image's applied index and names this node's ``raft.listen`` and
``raft.peers`` as the cluster.  Every node of the new cluster is restored from the same file;
started, they elect a leader and go on from there.

A cluster of several shards is backed up as a bundle of every shard's image
(:mod:`schedd.storage.bundle`); each shard of the node is restored from its own image into its
own directories, the same way.  The config's ``cluster.shards`` must be the bundle's.

Run as the user the service runs as.  Run as root, the files it writes are given to the owner
of ``node.data_dir`` (and of ``raft.journal_dir``), so that a service running as another user
can open them; a ``node.data_dir`` that does not exist yet is refused then, since its owner is
what says whose the files are.

Every failure is one line on stderr and a non-zero exit: 2 for the config and the command
line, 1 for the image or the data directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from schedd import datadir
from schedd.cli.snapshot import check_magic
from schedd.config import Config
from schedd.core.durations import format_time
from schedd.raft.snapshots import restore_data_dir
from schedd.shard.layout import shard_config
from schedd.storage.bundle import bundle_shards, is_bundle, unpack_bundle
from schedd.storage.snapshots import ImageFile, SnapshotError

PREFIX = "schedd restore: "


def _fail(message: str, code: int = 1) -> int:
    print(f"{PREFIX}{message}", file=sys.stderr)
    return code


def _ago(ms: int) -> str:
    s = max(0, int(time.time() - ms / 1000))
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    if s < 172_800:
        return f"{s // 3600}h ago"
    return f"{s // 86_400}d ago"


def _chown(paths: list[Path], uid: int, gid: int) -> None:
    for top in paths:
        if not top.exists():
            continue
        os.chown(top, uid, gid, follow_symlinks=False)
        if top.is_dir():
            for path in top.rglob("*"):
                os.chown(path, uid, gid, follow_symlinks=False)


def restore(cfg: Config, image: str) -> int:
    # what it did is printed below, once: the Raft layer's own log line is not shown too
    logging.getLogger("schedd").addHandler(logging.NullHandler())
    source = Path(image)
    if not source.is_file():
        what = "is not a file" if source.exists() else "no such file"
        return _fail(f"--from: {image}: {what}", 2)
    try:
        shards = bundle_shards(source) if is_bundle(source) else 1
    except SnapshotError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"--from: {image}: cannot read it: {exc.strerror or exc}")
    if cfg.cluster.shards != shards:
        held = "1 shard" if shards == 1 else f"{shards} shards"
        return _fail(
            f"cluster.shards: {image} holds a cluster of {held}; this config says shards = "
            f"{cfg.cluster.shards}: restore it with [cluster] shards = {shards}",
            2,
        )
    if shards > 1:
        return _restore_shards(cfg, source)
    data = cfg.data_path
    raft_dir = data / "raft"
    journal_dir = cfg.journal_path if cfg.raft.journal_dir is not None else None
    owner: tuple[int, int] | None = None
    if os.geteuid() == 0:
        if not data.is_dir():
            return _fail(
                f'node.data_dir: "{data}" does not exist; running as root, the restored files '
                "are given to its owner: create it for the user schedd runs as first (install "
                f"-d -o schedd -g schedd -m 0700 {data}), or restore as that user (sudo -u "
                "schedd schedd restore ...)"
            )
        st = data.stat()
        owner = (st.st_uid, st.st_gid)
    journal_existed = journal_dir is not None and journal_dir.exists()
    staging = raft_dir.with_name(f"{raft_dir.name}.restoring")  # restore_data_dir's own
    try:
        check_magic(source)
        checked = restore_data_dir(source, raft_dir, journal_dir, list(cfg.raft_addresses()))
    except SnapshotError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        return _fail(str(exc))
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        where = f' "{exc.filename}"' if exc.filename else ""
        return _fail(f"cannot write{where}: {exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        shutil.rmtree(staging, ignore_errors=True)
        return _fail(f"unexpected error: {type(exc).__name__}: {exc}; please report it")
    given = ""
    try:
        datadir.write_record(cfg, 1)
    except OSError as exc:
        return _fail(f'cannot write "{datadir.record_path(cfg)}": {exc.strerror or exc}')
    if owner is not None:
        _chown([raft_dir, datadir.record_path(cfg)], *owner)
        if journal_dir is not None and journal_existed:  # its owner's, like the directory
            st = journal_dir.stat()
            files = [journal_dir / "raft.journal", journal_dir / "raft.journal.state"]
            _chown(files, st.st_uid, st.st_gid)
        elif journal_dir is not None:  # made by the restore
            _chown([journal_dir], *owner)
        given = f"; its files belong to uid {owner[0]}, as {data} does"
    print(_summary(cfg, source, checked) + given)
    peers = ", ".join(cfg.raft.peers)
    print(
        "next: restore every other node of the new cluster "
        + (f"(raft.peers: {peers}) " if peers else "")
        + "from this same file, then start them all (systemctl start schedd); they elect a "
        f"leader and go on from index {checked.header.applied_index}. Start workers only "
        "once the cluster serves."
    )
    return 0


def _restore_shards(cfg: Config, source: Path) -> int:
    """Restore each shard of this node from a bundle: shard k's image into shard k's own
    directories, for the shard's Raft addresses (the nodes' Raft ports + k)."""
    data = cfg.data_path
    owner: tuple[int, int] | None = None
    if os.geteuid() == 0 and data.is_dir():
        st = data.stat()
        owner = (st.st_uid, st.st_gid)
    lines = []
    made: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="schedd-restore-", dir=_scratch(data)) as tmp:
        try:
            images = unpack_bundle(source, Path(tmp))
            for shard, image in enumerate(images):
                scfg = shard_config(cfg, shard)
                raft_dir = scfg.data_path / "raft"
                journal_dir = scfg.journal_path if scfg.raft.journal_dir is not None else None
                raft_dir.parent.mkdir(parents=True, exist_ok=True)
                check_magic(image)
                checked = restore_data_dir(
                    image, raft_dir, journal_dir, list(scfg.raft_addresses())
                )
                made.append(raft_dir.parent)
                if journal_dir is not None:
                    made.append(journal_dir)
                lines.append(f"  shard {shard}: " + _summary(scfg, source, checked))
        except SnapshotError as exc:
            return _fail(str(exc))
        except OSError as exc:
            where = f' "{exc.filename}"' if exc.filename else ""
            return _fail(f"cannot write{where}: {exc.strerror or exc}")
    try:
        datadir.write_record(cfg, cfg.cluster.shards)
    except OSError as exc:
        return _fail(f'cannot write "{datadir.record_path(cfg)}": {exc.strerror or exc}')
    if owner is not None:
        _chown_tree([data / "shards", *made, datadir.record_path(cfg)], *owner)
    print(f"restored {cfg.cluster.shards} shards of {data} from {source}:")
    print("\n".join(lines))
    peers = ", ".join(cfg.raft.peers)
    print(
        "next: restore every other node of the new cluster "
        + (f"(raft.peers: {peers}) " if peers else "")
        + "from this same file, then start them all (systemctl start schedd); each shard "
        "elects a leader and goes on from its image. Start workers only once the cluster "
        "serves."
    )
    return 0


def _scratch(data: Path) -> Path | None:
    """Where a bundle's images are unpacked: beside the data directory (the same disk, so
    the restore needs no room elsewhere), or the system's temporary directory."""
    return data if data.is_dir() else None


def _chown_tree(paths: list[Path], uid: int, gid: int) -> None:
    for top in paths:
        if not top.exists():
            continue
        _chown([top], uid, gid)
        if top.is_dir():
            for path in top.rglob("*"):
                _chown([path], uid, gid)


def _summary(cfg: Config, source: Path, checked: ImageFile) -> str:
    h = checked.header
    c = h.counts
    taken = f"taken {format_time(h.created_ms)} ({_ago(h.created_ms)})" if h.created_ms else ""
    term = "" if h.term is None else f" (term {h.term})"
    return (
        f"restored {cfg.data_path / 'raft'} from {source}: applied index {h.applied_index}"
        f"{term}, {taken} on node {h.node or '?'}: {c.get('jobs', 0):,} jobs, "
        f"{c.get('runs', 0):,} runs, {c.get('dead_letters', 0):,} dead letters"
    )
