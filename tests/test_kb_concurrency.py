"""Several engineers writing at once: real processes on one SQLite file lose nothing."""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuimon.errors import UserError
from tuimon.kb import IncidentDraft, KnowledgeBase
from tuimon.kb import db as kbdb
from tuimon.kb.location import KbLocation

WRITERS = 6
NOTES_EACH = 40

_NOTE_WRITER = """
import sys, time
from pathlib import Path
from tuimon.kb import KnowledgeBase
kb_dir, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
kb = KnowledgeBase.open(kb_dir, author=name)
(go.parent / f"ready-{name}").touch()
while not go.exists():
    time.sleep(0.002)
for i in range(count):
    kb.add_note(1, f"{name} note {i}")
    kb.add_tried(1, f"{name} tried {i}", "no_effect")
kb.close()
"""

_INCIDENT_OPENER = """
import sys, time
from pathlib import Path
from tuimon.kb import IncidentDraft, KnowledgeBase
kb_dir, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
kb = KnowledgeBase.open(kb_dir, author=name)
(go.parent / f"ready-{name}").touch()
while not go.exists():
    time.sleep(0.002)
for i in range(count):
    print(kb.open_incident(IncidentDraft(title=f"{name} incident {i}")).number, flush=True)
kb.close()
"""


def _run_together(script: str, kb_dir: Path, tmp_path: Path, count: int) -> list[str]:
    """Start WRITERS processes, release them at the same instant, return their stdout."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(kb_dir), f"writer{i}", str(count), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WRITERS)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < WRITERS:  # all open, then all start at once
        assert time.monotonic() < deadline, "writer processes did not start"
        dead = [proc for proc in procs if proc.poll() is not None]
        assert not dead, f"a writer process died while starting: {dead[0].communicate()[1]}"
        time.sleep(0.01)
    go.touch()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    return outputs


def test_concurrent_writers_keep_every_note(tmp_path: Path) -> None:
    kb_dir = tmp_path / "kb"
    with KnowledgeBase.open(kb_dir, author="setup") as kb:
        kb.open_incident(IncidentDraft(title="shared incident"))
    _run_together(_NOTE_WRITER, kb_dir, tmp_path, NOTES_EACH)
    with KnowledgeBase.open(kb_dir, author="check") as kb:
        timeline = kb.timeline(1)
        notes = {entry.text for entry in timeline if entry.type == "note"}
        tried = {entry.text for entry in timeline if entry.type == "tried"}
        expected_notes = {f"writer{w} note {i}" for w in range(WRITERS) for i in range(NOTES_EACH)}
        assert len([e for e in timeline if e.type == "note"]) == WRITERS * NOTES_EACH
        assert notes == expected_notes
        assert len(tried) == WRITERS * NOTES_EACH
        # The writers really overlapped: in time order, authors alternate many times.
        authors = [entry.author for entry in timeline]
        switches = sum(a != b for a, b in itertools.pairwise(authors))
        assert switches >= WRITERS  # run one after another, they would switch WRITERS - 1 times
        # Every note is findable: the search index kept up with the concurrent writes.
        assert kb.search("writer3 note")[0].incident.number == 1


def test_concurrent_openers_get_unique_numbers(tmp_path: Path) -> None:
    kb_dir = tmp_path / "kb"
    # The database does not exist yet: the first process creates and migrates it under the lock.
    outputs = _run_together(_INCIDENT_OPENER, kb_dir, tmp_path, 10)
    numbers = [int(line) for out in outputs for line in out.split()]
    assert sorted(numbers) == list(range(1, WRITERS * 10 + 1))
    with KnowledgeBase.open(kb_dir, author="check") as kb:
        assert kb.count() == WRITERS * 10
        assert kb.schema_version == 1


def test_a_new_knowledge_base_opens_while_another_connection_is_reading_it(tmp_path: Path) -> None:
    """Switching a new database to WAL needs the file to itself, and SQLite refuses the switch at
    once, busy timeout or not, while another connection reads: several people opening a new
    knowledge base at the same moment made all but one fail with "database is locked"."""
    location = KbLocation(tmp_path / "kb", "test")
    location.path.mkdir()
    reader = sqlite3.connect(location.db_path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a read lock on the new file
    threading.Timer(0.4, reader.execute, ["COMMIT"]).start()
    started = time.monotonic()
    kb = KnowledgeBase(location, author="alice", busy_timeout_ms=50)
    assert time.monotonic() - started >= 0.3  # it waited for the reader instead of failing
    assert kb.open_incident(IncidentDraft(title="first")).number == 1
    kb.close()
    reader.close()


def test_write_waits_out_a_lock_longer_than_the_busy_timeout(tmp_path: Path) -> None:
    kb = KnowledgeBase(KbLocation(tmp_path, "test"), author="alice", busy_timeout_ms=50)
    number = kb.open_incident(IncidentDraft(title="locked")).number
    holder = sqlite3.connect(kb.location.db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.6, holder.execute, ["COMMIT"]).start()
    started = time.monotonic()
    kb.add_note(number, "written after the other writer let go")
    assert time.monotonic() - started >= 0.5
    assert kb.timeline(number)[-1].text == "written after the other writer let go"
    holder.close()
    kb.close()


def test_write_gives_up_with_a_clear_error(tmp_path: Path) -> None:
    kb = KnowledgeBase(KbLocation(tmp_path, "test"), author="alice", busy_timeout_ms=20)
    holder = sqlite3.connect(kb.location.db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(UserError, match="stayed locked by another writer"):
            kbdb.write(kb._db, lambda: None, deadline_s=0.3)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        kb.close()


def test_another_process_note_is_seen_within_two_seconds(tmp_path: Path) -> None:
    kb_dir = tmp_path / "kb"
    watcher = KnowledgeBase.open(kb_dir, author="watcher")
    number = watcher.open_incident(IncidentDraft(title="watched")).number
    assert watcher.poll_changes()  # first poll: "load everything"
    assert not watcher.poll_changes()
    code = (
        "import sys; from tuimon.kb import KnowledgeBase; "
        "KnowledgeBase.open(sys.argv[1], author='bob').add_note(1, 'note from another tuimon')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(kb_dir)])
    assert proc.wait(timeout=60) == 0
    written = time.monotonic()
    while not watcher.poll_changes():
        assert time.monotonic() - written < 2.0, "change not detected within 2 s"
        time.sleep(0.1)
    assert [e.text for e in watcher.timeline(number)] == ["note from another tuimon"]
    assert watcher.timeline(number)[0].author == "bob"
    assert not watcher.poll_changes()
    watcher.add_note(number, "own write")
    assert watcher.poll_changes()  # our own writes count too
    watcher.close()
