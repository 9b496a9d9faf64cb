"""A FUSE filesystem that loses what was not synced when told to lose power - after LazyFS.

It passes every operation through to a backing directory, but remembers, for every file, what
each write or truncate since that file's last ``fsync``/``fdatasync`` overwrote (an undo log).
On ``crash`` it puts back every file as it was at its last sync, as a disk whose volatile cache
was lost would hold it: appended bytes gone, overwritten pages old again, a file renamed into
place with unsynced data empty under its new name.  Names (create, rename, unlink, mkdir) are
kept as done, as a journaling filesystem's metadata would be.  ``crash --keep random`` keeps a
random prefix of each file's unsynced writes instead of none (pages the kernel had already
written back, in order): torn tails.

Other faults, for the tests that need them:

- ``delay MS [MAX_MS]``: every ``fsync`` takes MS milliseconds longer, or a random time
  between MS and MAX_MS (a slow disk; ``seed N`` seeds it);
- ``full NAMES BYTES``: files called one of NAMES (comma-separated) may grow by BYTES more in
  all, then every write to them fails with ENOSPC and ``statfs`` shows no room (a full disk,
  hit by exactly those files); ``full off`` frees the space;
- ``trap NAME PID [N]``: at the N-th write (default 1) to a file called NAME from now on, kill
  process PID with SIGKILL before the write is done, then lose power: a crash in the middle of
  that file's write (a snapshot, a SQLite checkpoint).  ``status`` tells whether it fired.

Run as root (it mounts): ``python -m tests.cluster.lossyfs BACKING MOUNTPOINT CONTROL``, where
CONTROL is the path of a Unix socket taking one command per connection and answering one JSON
line; :class:`LossyMount` does all of it from a test.  libfuse 3 (Debian's ``fuse3``) and the
``mfusepy`` bindings are needed; :func:`available` says whether this machine has them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cluster.harness import Cluster


def available() -> str | None:
    """None when a lossy mount can be made here, else why not."""
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"no FUSE bindings (mfusepy, libfuse3): {exc}"
    return None


@dataclass
class _Undo:
    """One write or truncate: what it overwrote, to put back in reverse order."""

    offset: int
    old: bytes  # the bytes that were at [offset, offset + len(old)) before
    old_size: int  # the file's size before


@dataclass
class _File:
    path: str  # its current path in the backing directory
    undo: list[_Undo] = field(default_factory=list)


class LossyFS:
    """The operations (mfusepy's ``Operations`` interface)."""

    use_ns = True

    def __init__(self, backing: str) -> None:
        self.root = os.path.realpath(backing)
        self.lock = threading.RLock()
        self.files: dict[int, _File] = {}  # inode -> its unsynced changes
        self.fsync_delay = (0.0, 0.0)  # seconds, from .. to
        self.rng = random.Random(0)
        self.synced: dict[str, int] = {}  # fsyncs by file name
        self.trap: tuple[str, int, int] | None = None  # name, pid, writes left before it fires
        self.trapped = False
        self.full: tuple[set[str], int] | None = None  # names, bytes they may still grow by
        self.stats: dict[str, float] = {
            "writes": 0, "fsyncs": 0, "crashes": 0, "undone_writes": 0, "fsync_delayed_s": 0.0
        }  # fmt: skip

    # -- helpers -------------------------------------------------------------------------------
    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _record(self, fd: int, path: str, offset: int, length: int) -> None:
        st = os.fstat(fd)
        old = os.pread(fd, length, offset) if length > 0 and offset < st.st_size else b""
        entry = self.files.setdefault(st.st_ino, _File(path))
        entry.path = path
        entry.undo.append(_Undo(offset, old, st.st_size))

    def crash(self, keep: str = "none", seed: int = 0) -> int:
        """Every file back to its last sync (or a random prefix of its unsynced writes kept)."""
        rng = random.Random(seed)
        undone = 0
        with self.lock:
            for ino, entry in list(self.files.items()):
                undo = entry.undo
                if keep == "random" and undo:
                    undo = undo[rng.randint(0, len(undo)) :]
                try:
                    fd = os.open(entry.path, os.O_WRONLY)
                except FileNotFoundError:
                    continue
                try:
                    if os.fstat(fd).st_ino != ino:
                        continue  # the name now holds another file
                    for u in reversed(undo):
                        if u.old:
                            os.pwrite(fd, u.old, u.offset)
                        os.ftruncate(fd, u.old_size)
                        undone += 1
                finally:
                    os.close(fd)
            self.files.clear()
            self.stats["crashes"] += 1
            self.stats["undone_writes"] += undone
        return undone

    # -- files ---------------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self._full(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        out: dict[str, Any] = {k: getattr(st, k) for k in keys}
        for k in ("st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            out[k.removesuffix("_ns")] = getattr(st, k)
        return out

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._full(path), amode):
            raise OSError(errno.EACCES, "")
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._full(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        out = {k: getattr(sv, k) for k in keys}
        out.update(f_flag=sv.f_flag, f_frsize=sv.f_frsize, f_namemax=sv.f_namemax)
        if self.full is not None and self.full[1] == 0:
            out.update(f_bavail=0, f_bfree=0)
        return out

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._full(path))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._full(path))
        else:
            os.utime(self._full(path), ns=times)
        return 0

    def unlink(self, path: str) -> int:
        full = self._full(path)
        with self.lock:
            ino = os.lstat(full).st_ino
            os.unlink(full)
            entry = self.files.get(ino)
            if entry is not None and entry.path == full:
                del self.files[ino]
        return 0

    def rename(self, old: str, new: str) -> int:
        src, dst = self._full(old), self._full(new)
        with self.lock:
            with contextlib.suppress(FileNotFoundError):
                replaced = os.lstat(dst).st_ino
                self.files.pop(replaced, None)
            os.rename(src, dst)
            for entry in self.files.values():  # the file, or files under a renamed directory
                if entry.path == src or entry.path.startswith(src + "/"):
                    entry.path = dst + entry.path[len(src) :]
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return os.open(self._full(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

    def open(self, path: str, flags: int) -> int:
        # Every handle is opened read-write (an O_APPEND handle would ignore offsets): FUSE
        # hands each write its offset.
        return os.open(self._full(path), os.O_RDWR)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        full = self._full(path)
        with self.lock:
            if self.trap is not None and os.path.basename(full) == self.trap[0]:
                name, pid, left = self.trap
                if left > 1:
                    self.trap = (name, pid, left - 1)
                else:
                    self.trap, self.trapped = None, True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    self.crash()
                    raise OSError(errno.EIO, "power lost")
            if self.full is not None and os.path.basename(full) in self.full[0]:
                grows = max(0, offset + len(data) - os.fstat(fh).st_size)
                if grows > self.full[1]:
                    self.full = (self.full[0], 0)
                    raise OSError(errno.ENOSPC, "no space left")
                self.full = (self.full[0], self.full[1] - grows)
            self._record(fh, full, offset, len(data))
            self.stats["writes"] += 1
            return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        full = self._full(path)
        with self.lock:
            fd = fh if fh is not None else os.open(full, os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                self._record(fd, full, length, max(0, size - length))
                os.ftruncate(fd, length)
            finally:
                if fh is None:
                    os.close(fd)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        low, high = self.fsync_delay
        if high > 0:
            with self.lock:
                wait = low + (high - low) * self.rng.random()
            time.sleep(wait)
            self.stats["fsync_delayed_s"] += wait
        with self.lock:
            self.files.pop(os.fstat(fh).st_ino, None)
            self.stats["fsyncs"] += 1
            name = os.path.basename(path)
            self.synced[name] = self.synced.get(name, 0) + 1
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    # -- control -------------------------------------------------------------------------------
    def command(self, line: str) -> dict[str, Any]:
        words = line.split()
        if not words:
            return {"error": "empty command"}
        verb, args = words[0], words[1:]
        if verb == "crash":
            keep = args[args.index("--keep") + 1] if "--keep" in args else "none"
            seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 0
            return {"undone": self.crash(keep, seed)}
        if verb == "delay":
            low = float(args[0]) / 1000
            self.fsync_delay = (low, float(args[1]) / 1000 if len(args) > 1 else low)
            return {"delay_ms": args}
        if verb == "seed":
            with self.lock:
                self.rng = random.Random(int(args[0]))
            return {"seed": int(args[0])}
        if verb == "trap":
            with self.lock:
                self.trap = (args[0], int(args[1]), int(args[2]) if len(args) > 2 else 1)
                self.trapped = False
            return {"trap": args}
        if verb == "full":
            with self.lock:
                self.full = None if args[0] == "off" else (set(args[0].split(",")), int(args[1]))
            return {"full": args}
        if verb == "status":
            with self.lock:
                unsynced = sum(len(f.undo) for f in self.files.values())
                return {
                    **self.stats,
                    "unsynced_writes": unsynced,
                    "trapped": self.trapped,
                    "fsyncs_by_file": dict(self.synced),
                }
        return {"error": f"unknown command {verb!r}"}


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _serve_control(fs: LossyFS, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    reply = fs.command(_read_line(conn).decode().strip())
                except Exception as exc:  # noqa: BLE001 - the caller reads it
                    reply = {"error": repr(exc)}
                conn.sendall(json.dumps(reply).encode() + b"\n")

    threading.Thread(target=loop, name="lossyfs-control", daemon=True).start()


def main(argv: list[str]) -> None:
    import mfusepy

    backing, mountpoint, control = argv
    fs = LossyFS(backing)

    class Ops(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

    ops = Ops()
    for name in dir(fs):  # the operations, bound to the one filesystem
        if not name.startswith("_") and callable(getattr(fs, name)):
            setattr(ops, name, getattr(fs, name))
    for name in ("crash", "command"):
        delattr(ops, name)
    _serve_control(fs, control)
    # No attribute or name caching in the kernel: a crash changes sizes under it.
    mfusepy.FUSE(
        ops, mountpoint, foreground=True, nothreads=False, fsname="lossyfs",
        attr_timeout=0, entry_timeout=0, negative_timeout=0,
    )  # fmt: skip


# -- from a test --------------------------------------------------------------------------------
class LossyMount:
    """A lossy filesystem mounted at ``mountpoint`` over ``backing``, run in its own process."""

    def __init__(self, backing: Path, mountpoint: Path, log: Path) -> None:
        self.backing, self.mountpoint, self.log = backing, mountpoint, log
        self.control = str(backing.parent / f".{backing.name}.ctl")
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LossyMount:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parents[2]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.cluster.lossyfs", str(self.backing),
                 str(self.mountpoint), self.control],
                cwd=root, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 20
        while not (os.path.ismount(self.mountpoint) and os.path.exists(self.control)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"lossyfs did not mount: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.mountpoint)], check=False, capture_output=True)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def call(self, command: str) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(self.control)
            s.sendall(command.encode() + b"\n")
            reply: dict[str, Any] = json.loads(_read_line(s))
        if "error" in reply:
            raise RuntimeError(f"lossyfs {command!r}: {reply['error']}")
        return reply

    def crash(self, keep: str = "none", seed: int = 0) -> int:
        return int(self.call(f"crash --keep {keep} --seed {seed}")["undone"])


@contextlib.contextmanager
def lossy_cluster(tmp_path: Path, **kwargs: Any) -> Iterator[tuple[Cluster, list[LossyMount]]]:
    """A test cluster (``Cluster(tmp_path / "c", **kwargs)``) whose nodes' data directories
    are lossy mounts (backed by ``tmp_path / "disk"``), stopped and unmounted afterwards."""
    from tests.cluster.harness import Cluster

    root = tmp_path / "c"
    cluster = Cluster(root, **kwargs)
    with contextlib.ExitStack() as stack:
        mounts = [
            stack.enter_context(
                LossyMount(tmp_path / "disk" / n.node_id, root / n.node_id, tmp_path / f"{n.node_id}.fs.log")
            )
            for n in cluster.nodes
        ]  # fmt: skip
        try:
            yield cluster, mounts
        finally:
            cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
