"""Discovery: `tuimon watch` with no argument finds the live runs of this node, and only those."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from publisher.wire.registry import live_entries, register, runtime_dir, unregister

HOST = socket.gethostname()


def announce(
    run: str = "llama", rank: int = 0, pid: int | None = None, started: float | None = None, host: str = HOST
) -> Path:
    return register(
        run=run,
        rank=rank,
        host=host,
        pid=os.getpid() if pid is None else pid,
        pub="tcp://127.0.0.1:5555",
        snapshot="tcp://127.0.0.1:5556",
        record=None,
        started=time.time() if started is None else started,
    )


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_registered_run_is_found_with_everything_a_viewer_needs(private_runtime_dir: Path) -> None:
    started = time.time()
    path = register(
        run="llama-7b",
        rank=3,
        host=HOST,
        pid=os.getpid(),
        pub="tcp://127.0.0.1:5555",
        snapshot="tcp://127.0.0.1:5556",
        record="/data/run.jsonl",
        started=started,
    )

    [entry] = live_entries()

    assert (entry.run, entry.rank, entry.host, entry.pid) == ("llama-7b", 3, HOST, os.getpid())
    assert (entry.pub, entry.snapshot, entry.record) == (
        "tcp://127.0.0.1:5555",
        "tcp://127.0.0.1:5556",
        "/data/run.jsonl",
    )
    assert entry.started == started
    assert entry.path == path == private_runtime_dir / f"llama-7b.3.{os.getpid()}.json"
    assert json.loads(path.read_text())["v"] == 1
    assert [p.name for p in private_runtime_dir.iterdir()] == [path.name]  # no temporary file left over


def test_run_names_cannot_escape_the_runtime_folder(private_runtime_dir: Path) -> None:
    path = announce(run="../../etc/x y")

    assert path.parent == private_runtime_dir
    assert "/" not in path.name and not path.name.startswith(".")
    assert live_entries()[0].run == "../../etc/x y"  # the name itself is kept intact


def test_an_entry_whose_process_died_is_dropped_and_its_file_removed() -> None:
    alive = announce(run="alive")
    dead = announce(run="crashed", pid=dead_pid())

    assert [entry.run for entry in live_entries()] == ["alive"]
    assert alive.exists()
    assert not dead.exists()


def test_an_entry_whose_pid_was_recycled_by_a_newer_process_is_dropped() -> None:
    # This process started long after the entry claims its publisher did: not the same process.
    recycled = announce(pid=os.getpid(), started=time.time() - 30 * 24 * 3600)

    assert live_entries() == []
    assert not recycled.exists()


def test_entries_of_other_hosts_are_skipped_but_kept() -> None:
    elsewhere = announce(host="another-node", pid=dead_pid())

    assert live_entries() == []
    assert elsewhere.exists()  # its pid means nothing here: only its own host may judge it


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"v": 2, "run": "x"}',
        b'{"v": 1, "run": "x"}',
        b'{"v": 1, "run": "x", "rank": "0", "host": "h", "pid": 1, "pub": "p", "snapshot": "s", '
        b'"started": 1}',
        b"\xff\xfe",
        b"[" * 50_000,
    ],
    ids=["empty", "not-json", "list", "future-version", "missing-fields", "wrong-type", "binary", "bomb"],
)
def test_malformed_files_are_skipped_without_crashing(private_runtime_dir: Path, content: bytes) -> None:
    announce(run="good")
    junk = private_runtime_dir / "junk.0.1.json"
    junk.write_bytes(content)

    assert [entry.run for entry in live_entries()] == ["good"]
    assert junk.exists()  # not ours to delete: it may be a newer tuimon's entry


def test_entries_are_sorted_oldest_first_then_by_rank() -> None:
    now = time.time()
    announce(run="b", rank=1, started=now + 2)
    announce(run="a", rank=1, started=now + 1)
    announce(run="a", rank=0, started=now + 1)

    assert [(entry.run, entry.rank) for entry in live_entries()] == [("a", 0), ("a", 1), ("b", 1)]


def test_unregister_removes_the_entry_and_tolerates_a_second_call() -> None:
    path = announce()
    unregister(path)
    unregister(path)

    assert live_entries() == []


def test_runtime_dir_is_created_private(private_runtime_dir: Path) -> None:
    directory = runtime_dir()

    assert directory == private_runtime_dir
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_runtime_dir_left_open_to_others_is_made_private_again(private_runtime_dir: Path) -> None:
    private_runtime_dir.mkdir(mode=0o777)
    os.chmod(private_runtime_dir, 0o777)

    assert stat.S_IMODE(runtime_dir().stat().st_mode) == 0o700


def test_runtime_dir_that_is_a_symlink_is_refused(private_runtime_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    private_runtime_dir.symlink_to(tmp_path / "elsewhere")

    with pytest.raises(PermissionError, match=str(private_runtime_dir)):
        runtime_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_runtime_dir_owned_by_someone_else_is_refused(private_runtime_dir: Path) -> None:
    private_runtime_dir.mkdir(mode=0o700)
    os.chown(private_runtime_dir, 65534, -1)

    with pytest.raises(PermissionError, match="TUIMON_RUNTIME_DIR"):
        announce()


def test_runtime_dir_falls_back_to_xdg_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUIMON_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))

    assert runtime_dir() == tmp_path / "xdg" / "tuimon"
