"""The SQLite connection and its transactions: WAL, a busy timeout, BEGIN IMMEDIATE with retries.

Several engineers on one node each run their own tuimon against one database file. WAL lets
readers work while one writer writes; every write runs in ``BEGIN IMMEDIATE`` so the write lock
is taken up front (a deferred transaction that reads then writes fails with "database is locked"
when another writer got in between, and no busy timeout can help it). While another writer holds
the lock, the transaction is retried with short jittered sleeps until a deadline: a note is never
silently lost, and a failure is a clear error, not a traceback. The busy timeout covers the rest
(reads during a checkpoint or a recovery). Switching a new database to WAL is retried the same way:
SQLite answers that switch with "database is locked" at once, without its busy handler, while
another connection has the file open, which is what several people opening a new knowledge base at
the same moment do.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import sqlite_utils

from tuimon.errors import UserError

#: Milliseconds SQLite itself waits for a lock before reporting SQLITE_BUSY.
BUSY_TIMEOUT_MS = 5_000
#: Longest sleep between two attempts to take the write lock. Short, so that a waiting writer
#: catches the gaps between another writer's transactions instead of sleeping through them (a
#: retry costs microseconds).
MAX_RETRY_SLEEP_S = 0.003
#: Seconds a write keeps retrying before giving up with an error the user can act on.
WRITE_DEADLINE_S = 60.0

T = TypeVar("T")

_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


def connect(path: Path, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> sqlite_utils.Database:
    """Open ``path`` with our settings: autocommit driver mode (we issue BEGIN), WAL, busy timeout.

    ``check_same_thread=False`` because a dashboard reads on its UI thread and writes from worker
    threads; :class:`tuimon.kb.api.KnowledgeBase` serialises use of the connection with a lock.
    """
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        db = sqlite_utils.Database(conn)
        # Once one connection has switched the file to WAL, the others find it so and stop here.
        _while_busy(db.enable_wal, WRITE_DEADLINE_S, f"the knowledge base {path} stayed locked while "
                                                     f"being created for {WRITE_DEADLINE_S:.0f} s")
    except sqlite3.Error as exc:
        raise UserError(f"cannot open the knowledge base {path}: {exc}") from None
    return db


def is_busy(exc: BaseException) -> bool:
    """True for "database is locked" / "database table is locked" (incl. extended codes)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and (code & 0xFF) in _BUSY_CODES


def write(db: sqlite_utils.Database, body: Callable[[], T], *, deadline_s: float = WRITE_DEADLINE_S) -> T:
    """Run ``body`` in a ``BEGIN IMMEDIATE`` transaction; retry it whole while the database is busy.

    ``body`` must only touch the database (it may run several times; only the last run commits).
    Waiting for the write lock is done here rather than by SQLite's busy handler, which sleeps up
    to 100 ms between attempts: with several writers that idles the lock most of the time (4
    writers measured at a third of one writer's throughput). Short jittered sleeps keep it busy.
    """

    def attempt() -> T:
        _begin_immediate(db.conn)
        try:
            result = body()
            db.conn.execute("COMMIT")
        except BaseException:
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            raise
        return result

    return _while_busy(attempt, deadline_s, f"the knowledge base stayed locked by another writer for "
                                            f"{deadline_s:.0f} s; try again (is a process stuck holding it?)")


def _while_busy(attempt: Callable[[], T], deadline_s: float, give_up: str) -> T:
    """``attempt()``, again after a short jittered sleep while the database is busy; a
    :class:`UserError` saying ``give_up`` after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    delay = 0.0005
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            if time.monotonic() >= deadline:
                raise UserError(give_up) from None
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 1.5, MAX_RETRY_SLEEP_S)


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE`` that fails at once when another writer holds the lock (see :func:`write`)."""
    timeout = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("BEGIN IMMEDIATE")
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")


@contextlib.contextmanager
def read(db: sqlite_utils.Database) -> Iterator[sqlite_utils.Database]:
    """A read transaction: every query inside sees one snapshot (WAL readers never block writers)."""
    if db.conn.in_transaction:
        yield db
        return
    db.conn.execute("BEGIN")
    try:
        yield db
    finally:
        if db.conn.in_transaction:
            db.conn.execute("COMMIT")


def data_version(db: sqlite_utils.Database) -> int:
    """SQLite's per-connection counter that changes when *another* connection commits.

    Costs no I/O, which is why a UI timer can poll it a few times a second.
    """
    return int(db.conn.execute("PRAGMA data_version").fetchone()[0])
