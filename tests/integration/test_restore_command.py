"""``schedd restore --from FILE``: a node of a new cluster seeded from a backup starts with the
backup's state; a data directory that holds a state, a damaged image or a bad config is one
line and a non-zero exit, and leaves nothing behind; run as root, the files it writes belong
to the owner of the data directory (run as that user, they are its own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from schedd.auth import ensure_admin_token
from schedd.cli.node import main
from schedd.config import load_config
from schedd.datadir import read_record
from schedd.storage.snapshots import verify_image
from tests.conftest import free_port, wait_for

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "snapshot-image-v1.snap"
HEADER = verify_image(SAMPLE).header  # the frozen sample's: what a restore must say
COUNTS = HEADER.counts
NOBODY = 65534
BIN = Path(sys.executable).parent


def _flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def restore(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["restore", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def node_args(data: Path, port: int) -> list[str]:
    return [
        "--data-dir",
        str(data),
        "--http",
        f"127.0.0.1:{port}",
        "--raft",
        f"127.0.0.1:{port + 1}",
    ]


@pytest.mark.parametrize("journal_dir", [False, True], ids=["journal-beside", "journal-dir"])
async def test_a_restored_node_starts_with_the_backups_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], journal_dir: bool
) -> None:
    from schedd.runtime import Runtime

    data, port = tmp_path / "n1", free_port()
    data.mkdir()
    argv = ["--from", str(SAMPLE), *node_args(data, port)]
    raft: dict[str, object] = {}
    if journal_dir:
        raft["journal_dir"] = str(tmp_path / "journal")
        config = tmp_path / "n1.toml"
        config.write_text(f'[raft]\njournal_dir = "{tmp_path / "journal"}"\n')
        argv += ["--config", str(config)]
    code, out, err = restore(capsys, *argv)
    assert (code, err) == (0, "")
    first, second = out.splitlines()
    assert first.startswith(
        f"restored {data / 'raft'} from {SAMPLE}: applied index {HEADER.applied_index} "
        f"(term {HEADER.term}), "
    )
    assert first.endswith(
        f"on node {HEADER.node}: {COUNTS['jobs']} jobs, {COUNTS['runs']} runs, "
        f"{COUNTS['dead_letters']} dead letters"
        + (f"; its files belong to uid 0, as {data} does" if os.geteuid() == 0 else "")
    )
    assert second.startswith("next: restore every other node of the new cluster from this same")
    where = tmp_path / "journal" if journal_dir else data / "raft"
    assert (where / "raft.journal").is_file() and (where / "raft.journal.state").is_file()
    assert not (data / "raft.restoring").exists()
    assert read_record(load_config(None, env={}, overrides={"node.data_dir": str(data)})) == 1

    overrides: dict[str, object] = {
        "node.data_dir": str(data),
        "http.listen": f"127.0.0.1:{port}",
        "raft.listen": f"127.0.0.1:{port + 1}",
        **{f"raft.{k}": v for k, v in raft.items()},
    }
    cfg = load_config(None, env={}, overrides=overrides)
    token, _ = ensure_admin_token(cfg.tokens_path)
    rt = Runtime(cfg)
    await rt.start()
    try:
        await wait_for(lambda: rt.leader is not None and rt.leader.ready.is_set(), timeout=15)
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/api/v1"
            auth = {"Authorization": f"Bearer {token}"}
            async with http.get(url + "/jobs", headers=auth) as r:
                assert r.status == 200
                assert len((await r.json())["jobs"]) == COUNTS["jobs"]
            async with http.get(url + "/dlq", headers=auth) as r:
                assert len((await r.json())["runs"]) == COUNTS["dead_letters"]
        # the new leader's claim, after the image's state
        assert rt.node.applied_index > HEADER.applied_index
    finally:
        await rt.stop()


def test_a_node_that_holds_a_state_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, port = tmp_path / "n1", free_port()
    data.mkdir()
    assert restore(capsys, "--from", str(SAMPLE), *node_args(data, port))[0] == 0
    before = {p: p.read_bytes() for p in (data / "raft").iterdir()}
    code, out, err = restore(capsys, "--from", str(SAMPLE), *node_args(data, port))
    assert (code, out) == (1, "")
    assert err.startswith(f"schedd restore: {data / 'raft'}: this node already holds a state (")
    assert err.count("\n") == 1
    assert {p: p.read_bytes() for p in (data / "raft").iterdir()} == before


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (SAMPLE.read_bytes()[:-1000], "an incomplete snapshot (the file ends before its end"),
        (
            _flipped(SAMPLE.read_bytes(), len(SAMPLE.read_bytes()) // 2),
            "a damaged snapshot (a frame's checksum does not match at byte ",
        ),
        (b"SQLite format 3\x00" + bytes(100), "not a schedd snapshot"),
        (b"hi\n", "not a schedd snapshot"),
    ],
    ids=["truncated", "byte-flipped", "sqlite", "text"],
)
def test_a_damaged_image_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str
) -> None:
    image = tmp_path / "backup.snap"
    image.write_bytes(content)
    data = tmp_path / "n1"
    data.mkdir()
    code, out, err = restore(capsys, "--from", str(image), *node_args(data, free_port()))
    assert (code, out) == (1, "")
    assert err.startswith(f"schedd restore: {image}: {says}"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(data.iterdir()) == []


def test_usage_and_config_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "n1"
    code, _, err = restore(capsys, "--from", str(tmp_path / "nope.snap"), "--data-dir", str(data))
    assert code == 2 and err == f"schedd restore: --from: {tmp_path / 'nope.snap'}: no such file\n"
    code, _, err = restore(capsys, "--from", str(SAMPLE), "--config", str(tmp_path / "none.toml"))
    assert code == 2 and err.startswith("schedd restore: config: ")
    sharded = tmp_path / "sharded.toml"
    sharded.write_text("[cluster]\nshards = 3\n")
    code, _, err = restore(
        capsys, "--from", str(SAMPLE), "--config", str(sharded), "--data-dir", str(data)
    )
    assert code == 2 and err == (
        f"schedd restore: cluster.shards: {SAMPLE} holds a cluster of 1 shard; this config "
        "says shards = 3: restore it with [cluster] shards = 1\n"
    )
    assert not data.exists()
    with pytest.raises(SystemExit) as exit_:
        main(["restore", "--data-dir", str(data)])  # no --from
    assert exit_.value.code == 2
    assert "--from" in capsys.readouterr().err


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@root_only
def test_as_root_the_files_belong_to_the_owner_of_the_data_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "n1"
    code, _, err = restore(capsys, "--from", str(SAMPLE), *node_args(data, free_port()))
    assert code == 1
    assert err.startswith(f'schedd restore: node.data_dir: "{data}" does not exist; running as')
    assert not data.exists()
    data.mkdir()
    os.chown(data, NOBODY, NOBODY)
    code, out, _ = restore(capsys, "--from", str(SAMPLE), *node_args(data, free_port()))
    assert code == 0 and f"its files belong to uid {NOBODY}" in out
    for path in [data / "raft", *(data / "raft").rglob("*")]:
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), path


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="schedd-restore-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@root_only
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv")
def test_run_as_the_service_user_the_files_are_its_own(shared_dir: Path) -> None:
    image = shared_dir / "backup.snap"
    shutil.copy(SAMPLE, image)
    image.chmod(0o644)
    data = shared_dir / "n1"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            str(BIN / "schedd"),
            "restore",
            "--from",
            str(image),
            *node_args(data, free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(shared_dir)},
    )
    if "Permission denied" in done.stderr and str(BIN) in done.stderr:
        pytest.skip("the virtualenv cannot be run by another user here")
    assert done.returncode == 0, done.stderr
    assert "belong to uid" not in done.stdout
    for path in [data / "raft", *(data / "raft").rglob("*")]:
        assert path.stat().st_uid == NOBODY, path
