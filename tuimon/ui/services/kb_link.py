"""The dashboard's link to the incident knowledge base: opened, watched and written off the UI thread.

Several engineers on a node each run their own tuimon on one SQLite file. The link opens two
connections in a thread worker: a *reader*, which screens query from their own thread workers
and which a watch loop polls for changes twice a second (``PRAGMA data_version``: no disk I/O
when nothing changed), and a *writer*, fed by a queue that one thread worker drains in order.
Two connections, because a write can wait up to a minute while another engineer's write holds
the lock, and the screen must keep reading and noticing changes meanwhile; one queue, so that
quick successive actions (tick, untick) land in the order they were made, and so that an export
queued after a note includes the note.

Nothing here touches a widget: results travel as messages (``post_message`` is thread-safe) and
"seen before" offers as notifications (``App.notify`` is thread-safe).
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from textual.app import App
from textual.message import Message
from textual.message_pump import MessagePump
from textual.worker import get_current_worker

from tuimon.errors import UserError
from tuimon.kb import Incident, IncidentFilter, KnowledgeBase, SeenBefore
from tuimon.kb.location import KbLocation
from tuimon.store import EventRecord

#: Seconds between two looks at the change counter (docs/incidents.md promises 2 s end to end).
POLL_S = 0.5
#: Seconds a reader waits for the knowledge base to open (opening may wait for a migration).
OPEN_TIMEOUT_S = 90.0
#: Seconds a "seen before" notification stays up.
OFFER_TIMEOUT_S = 12.0
#: Past incidents of an event's kind looked at when checking whether it is already recorded.
EVENT_LOOKUP_LIMIT = 50


class KnowledgeBaseChanged(Message):
    """Something was committed to the knowledge base, by anyone: reload what is shown."""


class KbWritten(Message):
    """A write submitted with :meth:`KbLink.submit` finished; ``error`` says why it failed."""

    def __init__(self, what: str, result: Any, error: str | None) -> None:
        super().__init__()
        self.what = what
        self.result = result
        self.error = error


@dataclass(frozen=True)
class _Job:
    what: str
    work: Callable[[KnowledgeBase], Any]
    reply_to: MessagePump


def error_text(exc: BaseException) -> str:
    """What a user is told when a knowledge-base call fails (our errors are already sentences)."""
    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, sqlite3.Error):
        return f"knowledge base error: {exc}"
    return f"{type(exc).__name__}: {exc}"


#: Events remembered as offered before the ones no longer shown are forgotten.
_OFFERED_MEMORY = 20_000


class KbLink:
    """One app's connection to the knowledge base ``kb_dir`` (None: ``$TUIMON_KB``, config, default).

    :meth:`start` it from the app; screens :meth:`subscribe` to hear of changes, read through
    :meth:`reader` from their thread workers and write through :meth:`submit`.
    """

    def __init__(self, kb_dir: str | os.PathLike[str] | None = None, *, author: str | None = None) -> None:
        self.kb_dir = kb_dir
        self.author = author
        self.location: KbLocation | None = None
        self.error: str | None = None
        self._reader: KnowledgeBase | None = None
        self._writer: KnowledgeBase | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._subscribers: tuple[MessagePump, ...] = ()
        self._seen: dict[str, SeenBefore] = {}
        self._generation = 0
        self._offered: set[tuple[str, str]] = set()
        self._app: App[Any] | None = None

    # -- lifecycle (UI thread) ------------------------------------------------------------------

    def start(self, app: App[Any]) -> None:
        """Open the knowledge base and start watching it, in thread workers of ``app``."""
        self._app = app
        app.run_worker(self._watch, name="kb-watch", group="kb-link", thread=True, exit_on_error=False)
        app.run_worker(self._write_loop, name="kb-writer", group="kb-link", thread=True, exit_on_error=False)

    def stop(self) -> None:
        """End the workers now (they would notice the app's end within :data:`POLL_S`); writes
        still queued are made first."""
        self._stopping.set()
        self._jobs.put(None)

    def subscribe(self, node: MessagePump) -> None:
        """``node`` gets :class:`KnowledgeBaseChanged` whenever anyone commits (and once it opened)."""
        self._subscribers = (*self._subscribers, node)

    def unsubscribe(self, node: MessagePump) -> None:
        self._subscribers = tuple(s for s in self._subscribers if s is not node)

    def submit(self, what: str, work: Callable[[KnowledgeBase], Any], reply_to: MessagePump) -> None:
        """Run ``work(writer)`` on the writer thread, after every write submitted before it;
        ``reply_to`` then gets :class:`KbWritten` with its result or error."""
        self._jobs.put(_Job(what, work, reply_to))

    def offer_seen_before(self, run: str, events: Iterable[EventRecord]) -> None:
        """Notify, once per event, when past incidents of a new event's kind exist (and what helped).

        Called on every redraw of the event log: only events not offered before cost anything,
        and the query runs in a thread worker (answers are cached per kind until the next change).
        """
        events = list(events)
        fresh = [event for event in events if (run, event.id) not in self._offered]
        if not fresh or self._app is None:
            return
        if len(self._offered) > _OFFERED_MEMORY:
            # Forget events the store no longer holds (a flood of events): they cannot come back.
            held = {(run, event.id) for event in events}
            self._offered = {key for key in self._offered if key[0] != run or key in held}
        self._offered.update((run, event.id) for event in fresh)
        kinds = list(dict.fromkeys(event.kind for event in fresh))
        self._app.run_worker(
            partial(self._offer, kinds), name="kb-offer", group="kb-offer", thread=True, exit_on_error=False
        )

    # -- reading (worker threads) ---------------------------------------------------------------

    def _wait_open(self) -> None:
        if not self._ready.wait(OPEN_TIMEOUT_S):
            raise UserError(f"the knowledge base did not open within {OPEN_TIMEOUT_S:.0f} s")
        if self.error:
            raise UserError(self.error)

    def reader(self) -> KnowledgeBase:
        """The reading connection, once open; a UserError says why there is none."""
        self._wait_open()
        if self._reader is None:
            raise UserError("the knowledge base is closed")
        return self._reader

    def seen_before(self, kind: str, *, exclude: int | None = None) -> SeenBefore:
        """Past incidents of ``kind`` and what helped (``exclude``: the incident being looked at);
        cached until the knowledge base changes."""
        if exclude is not None:
            return self.reader().seen_before([kind], exclude=exclude)
        generation = self._generation
        cached = self._seen.get(kind)
        if cached is not None:
            return cached
        found = self.reader().seen_before([kind])
        if generation == self._generation:
            self._seen[kind] = found
        return found

    def incidents_with_event(self, run: str, event: EventRecord) -> list[Incident]:
        """Incidents that already hold this event (same run and event id), newest first."""
        kb = self.reader()
        candidates = kb.list_incidents(IncidentFilter(run=run, kinds=(event.kind,)), limit=EVENT_LOOKUP_LIMIT)
        found = []
        for incident in candidates:
            step, first, last = event.step, incident.step_first, incident.step_last
            if step is not None and first is not None and last is not None and not first <= step <= last:
                continue  # the incident's steps are elsewhere: no need to read its timeline
            entries = kb.timeline(incident.number)
            if any(e.type == "event" and (e.data or {}).get("id") == event.id for e in entries):
                found.append(incident)
        return found

    # -- the workers ----------------------------------------------------------------------------

    def _broadcast(self) -> None:
        for node in self._subscribers:
            node.post_message(KnowledgeBaseChanged())

    def _watch(self) -> None:
        """Open both connections, then poll the change counter until the app ends."""
        worker = get_current_worker()
        try:
            reader = KnowledgeBase.open(self.kb_dir, author=self.author)
            try:
                self._writer = KnowledgeBase(reader.location, author=reader.author)
            except BaseException:
                reader.close()
                raise
        except (UserError, sqlite3.Error, OSError) as exc:
            self.error = f"cannot open the knowledge base: {error_text(exc)}"
            self._ready.set()
            self._broadcast()
            return
        self.location = reader.location
        self._reader = reader
        self._ready.set()
        try:
            while not worker.is_cancelled:
                if reader.poll_changes():
                    self._generation += 1
                    self._seen = {}
                    self._broadcast()
                if self._stopping.wait(POLL_S):
                    break
        finally:
            self._reader = None
            reader.close()

    def _write_loop(self) -> None:
        """Run submitted writes one after the other; at the end, those still queued (nothing typed
        is lost)."""
        worker = get_current_worker()
        while not (worker.is_cancelled or self._stopping.is_set()):
            try:
                job = self._jobs.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if job is not None:
                self._run(job)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self._run(job)
        self._ready.wait(OPEN_TIMEOUT_S)  # an app ended while opening: close what it opened
        if self._writer is not None:
            self._writer.close()

    def _run(self, job: _Job) -> None:
        result, error = None, None
        try:
            self._wait_open()
            assert self._writer is not None
            result = job.work(self._writer)
        except Exception as exc:  # reported to the screen that asked; the loop must go on
            error = error_text(exc)
        job.reply_to.post_message(KbWritten(job.what, result, error))

    def _offer(self, kinds: list[str]) -> None:
        assert self._app is not None
        for kind in kinds:
            try:
                seen = self.seen_before(kind)
            except UserError:
                return  # no knowledge base: the incident screen says why
            if seen.total:
                self._app.notify(
                    f"{kind}: {seen.headline()}. Press i to see them.",
                    title="Seen before",
                    timeout=OFFER_TIMEOUT_S,
                    markup=False,
                )
