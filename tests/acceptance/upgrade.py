"""An earlier release of schedd, built from this repository's history, for the upgrade tests.

:func:`release_bin` exports a commit's tree (``git archive``), builds its wheel
(``pip wheel --no-deps``) and installs it into a virtualenv of its own under
``.venv-upgrade/<commit>`` (ignored by git), with its dependencies at the versions this tree's
virtualenv runs, so that the two differ only in schedd.  The virtualenv is built once per
commit, under a lock (two test runs may want it at once), and is marked complete only when
its ``schedd`` answers; a half-built one is built again.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from tests.cluster.harness import REPO

#: The previous release: the last commit before the most recent change of a format or protocol
#: that nodes share. The commit after it made log compaction write a small marker (``SCHDMARK``)
#: as ``raft/raft.dump`` instead of a whole SQLite copy, and sends a follower a whole copy as an
#: image stream (``SCHDSNAP``); the Raft hello gained a ``data`` field later in the same work.
#: This release compacts into a format-1 ``raft.dump`` (a whole copy of the state database).
PREVIOUS_RELEASE = "25e043b7ad61976ad281220f494c48b41da0a31d"

#: The last commit whose front doors served a worker from another node's shard with a websocket
#: per worker and shard (``X-Schedd-Shard`` on the worker endpoint), before the one link per
#: shard (``/internal/shard-link``): the earliest cluster of several shards upgraded in the tests.
SHARDS_RELEASE = "3f1360a38b30598ec44aa46051c224908ad86904"

CACHE = REPO / ".venv-upgrade"
BUILD_TIMEOUT_S = 240.0


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked for {timeout:.0f}s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(
    args: list[str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(args, capture_output=True, timeout=max(1.0, timeout), cwd=cwd, env=env)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:4])}... exited {done.returncode}\n"
            f"{done.stdout.decode(errors='replace')[-3000:]}\n"
            f"{done.stderr.decode(errors='replace')[-3000:]}"
        )
    return done


def _constraints() -> str:
    """This virtualenv's packages at their versions, schedd itself left out."""
    pins = {
        d.metadata["Name"].lower(): d.version
        for d in metadata.distributions()
        if d.metadata["Name"] and d.metadata["Name"].lower() != "schedd"
    }
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def release_bin(commit: str = PREVIOUS_RELEASE) -> Path:
    """The ``bin`` directory of a virtualenv with schedd as of ``commit`` installed (built the
    first time it is asked for)."""
    target = CACHE / commit
    stamp = target / ".schedd-release"
    if stamp.exists():
        return target / "bin"
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    with _locked(CACHE / f"{commit}.lock", BUILD_TIMEOUT_S):
        if stamp.exists():  # built by another run while this one waited
            return target / "bin"
        shutil.rmtree(target, ignore_errors=True)
        _run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], 30)
        with tempfile.TemporaryDirectory(prefix="schedd-release-") as tmp:
            src, wheels = Path(tmp) / "src", Path(tmp) / "wheels"
            tree = _run(["git", "-C", str(REPO), "archive", "--format=tar", commit], 60).stdout
            with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
                tar.extractall(src, filter="data")
            pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
            left = deadline - time.monotonic()
            _run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(src)], left)
            (wheel,) = wheels.glob("schedd-*.whl")
            _run([sys.executable, "-m", "venv", str(target)], deadline - time.monotonic())
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text(_constraints())
            py = str(target / "bin" / "python")
            args = [py, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
            _run([*args, "-c", str(constraints), str(wheel)], deadline - time.monotonic())
        # It runs, and it is the release asked for (not this tree, through a path).
        _run([str(target / "bin" / "schedd"), "--help"], 60, cwd=target)
        stamp.write_text(f"{commit}\n")
    return target / "bin"
