"""The knowledge base as one object: what the CLI and the dashboard's incident screens call.

One :class:`KnowledgeBase` holds one SQLite connection and the runbooks, and serialises use of
the connection with a lock, so a Textual screen may call it from its UI thread (reads, which are
fast) and from worker threads (writes, which may wait while another engineer's write holds the
lock). Incidents are named by ``ref``: a number (``12``, ``"#12"``), a UUID or a
unique UUID prefix.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuimon.errors import UserError
from tuimon.kb import capture, incidents, schema, search, similar
from tuimon.kb import db as kbdb
from tuimon.kb.export import ExportFolder, ExportReport, render
from tuimon.kb.incidents import NO_FILTER, IncidentFilter, MergeOutcome
from tuimon.kb.location import KbLocation, prepare_folder, resolve_author, resolve_location
from tuimon.kb.markdown_import import ParseError, parse_file
from tuimon.kb.model import ContextRecord, Entry, Incident, IncidentDraft
from tuimon.kb.problems import FileProblem
from tuimon.kb.runbooks import RunbookLibrary, RunbookProgress, load_runbooks, progress, shipped_runbooks_dir

Ref = int | str


@dataclass
class ImportReport:
    imported: list[tuple[Path, MergeOutcome]] = field(default_factory=list)
    problems: list[FileProblem] = field(default_factory=list)


class KnowledgeBase:
    """An open knowledge base. Use :meth:`open`; close it (or use ``with``) when done."""

    def __init__(
        self, location: KbLocation, *, author: str, busy_timeout_ms: int = kbdb.BUSY_TIMEOUT_MS
    ) -> None:
        self.location = location
        self.author = author
        prepare_folder(location)
        self._lock = threading.RLock()
        self._db = kbdb.connect(location.db_path, busy_timeout_ms=busy_timeout_ms)
        try:
            schema.ensure_current(self._db)
        except BaseException:
            self._db.close()
            raise
        self._runbooks: RunbookLibrary | None = None
        self._last_token: tuple[int, int] | None = None

    @classmethod
    def open(
        cls,
        kb_dir: str | os.PathLike[str] | None = None,
        *,
        author: str | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> KnowledgeBase:
        """Open (creating if needed) the knowledge base ``--kb``/``$TUIMON_KB``/config/default names."""
        return cls(resolve_location(kb_dir, env), author=resolve_author(author, env))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return schema.schema_version(self._db)

    # -- runbooks ------------------------------------------------------------------------------

    @property
    def runbooks(self) -> RunbookLibrary:
        """Shipped runbooks plus the team's (``<kb>/runbooks``), loaded once; see :meth:`reload_runbooks`."""
        if self._runbooks is None:
            self._runbooks = load_runbooks([shipped_runbooks_dir(), self.location.runbooks_dir])
        return self._runbooks

    def reload_runbooks(self) -> RunbookLibrary:
        self._runbooks = None
        return self.runbooks

    def progress(self, ref: Ref) -> list[RunbookProgress]:
        """The checklist of every runbook matching the incident's kinds, with what is ticked."""
        incident = self.get(ref)
        entries = self.timeline(incident.number)
        return [progress(runbook, entries) for runbook in self.runbooks.for_kinds(incident.kinds)]

    # -- reading -------------------------------------------------------------------------------

    def resolve(self, ref: Ref) -> int:
        with self._lock:
            return self._number(ref)

    def _number(self, ref: Ref) -> int:
        """The incident ``ref`` names; an error naming this knowledge base when none does (several
        can exist: ``--kb``, ``$TUIMON_KB``, the config file, the default)."""
        try:
            return incidents.resolve(self._db, ref)
        except incidents.UnknownIncident as exc:
            where = f"the knowledge base at {self.location.path} ({self.location.source})"
            raise incidents.UnknownIncident(f"{exc} in {where}") from None

    def get(self, ref: Ref) -> Incident:
        with self._lock:
            return incidents.get(self._db, self._number(ref))

    def list_incidents(
        self, where: IncidentFilter = NO_FILTER, *, limit: int | None = 50, offset: int = 0
    ) -> list[Incident]:
        """Incidents matching ``where``, most recently active first."""
        with self._lock:
            return incidents.list_incidents(self._db, where, limit=limit, offset=offset)

    def count(self, where: IncidentFilter = NO_FILTER) -> int:
        with self._lock:
            return incidents.count(self._db, where)

    def timeline(self, ref: Ref) -> list[Entry]:
        with self._lock:
            return incidents.timeline(self._db, self._number(ref))

    def context(self, ref: Ref) -> list[ContextRecord]:
        with self._lock:
            return incidents.context(self._db, self._number(ref))

    def search(
        self, text: str, *, where: IncidentFilter = NO_FILTER, limit: int = 20
    ) -> list[search.SearchHit]:
        """Full-text search, ranked; each hit has a snippet with the matched words highlighted."""
        with self._lock, kbdb.read(self._db):
            return search.search(self._db, text, where=where, limit=limit)

    def seen_before(
        self, kinds: Iterable[str], *, exclude: Ref | None = None, limit: int = 5
    ) -> similar.SeenBefore:
        """Past incidents of these kinds and what helped, for "seen before" when an event fires."""
        with self._lock, kbdb.read(self._db):
            number = self._number(exclude) if exclude is not None else None
            return similar.seen_before(self._db, kinds, exclude=number, limit=limit)

    # -- change detection ----------------------------------------------------------------------

    def change_token(self) -> tuple[int, int]:
        """Changes when anything was committed, by another process (data_version) or by us."""
        with self._lock:
            return kbdb.data_version(self._db), self._db.conn.total_changes

    def poll_changes(self) -> bool:
        """True when the knowledge base changed since the previous call (first call: True).

        Cheap (no disk I/O when nothing changed): call it from a UI timer every 0.5 s and reload
        the visible incident or list when it says so.
        """
        token = self.change_token()
        changed = token != self._last_token
        self._last_token = token
        return changed

    # -- writing -------------------------------------------------------------------------------

    def open_incident(self, draft: IncidentDraft) -> Incident:
        """Open an incident (a blank one: ``IncidentDraft(title=...)``)."""
        with self._lock:
            return incidents.create(self._db, draft, self.author)

    def open_from_event(
        self,
        event: capture.EventLike,
        *,
        run: str | None = None,
        host: str | None = None,
        run_start: Mapping[str, Any] | None = None,
        metrics: capture.MetricSeries | None = None,
        gpu_devices: Iterable[capture.DeviceLike] = (),
        window: int = capture.DEFAULT_WINDOW,
        title: str | None = None,
        tags: Iterable[str] = (),
        summary: str = "",
    ) -> Incident:
        """Open an incident from an anomaly event, capturing the evidence around it.

        ``event`` is a protocol ``event`` message, or the viewer's event record with ``run`` (and
        ``host``) given; ``metrics`` is the event's rank's metrics around it as ``name -> (steps,
        values)`` (``Store.metric_window``; a window of ``window`` steps each side is kept);
        ``gpu_devices`` are the latest device entries with ``rank``/``host`` (or the store's device
        views); ``run_start`` is the run's ``run_start`` message (the reproduction record).
        """
        found = capture.as_event(event, run=run, host=host)
        captured = capture.capture(
            [found], run_start=run_start, metrics=metrics, gpu_devices=gpu_devices, window=window
        )
        return self._open_event(found, captured, title=title, tags=tags, summary=summary)

    def open_from_recording(
        self,
        recording: str | Path,
        event_id: str,
        *,
        window: int = capture.DEFAULT_WINDOW,
        title: str | None = None,
        tags: Iterable[str] = (),
        summary: str = "",
        severity: str | None = None,
    ) -> Incident:
        """Open an incident from event ``event_id`` of a run's recording (a file, a ``--record``
        prefix, a folder), with the same evidence."""
        found, captured = capture.from_recording(recording, event_id, window=window)
        return self._open_event(found, captured, title=title, tags=tags, summary=summary, severity=severity)

    def _open_event(
        self,
        found: dict[str, Any],
        captured: dict[str, dict[str, Any]],
        *,
        title: str | None,
        tags: Iterable[str],
        summary: str,
        severity: str | None = None,
    ) -> Incident:
        first, last = capture.event_steps([found])
        draft = IncidentDraft(
            title=title or capture.title_for([found]),
            severity=severity or capture.severity_for([found]),
            run=found.get("run"),
            host=found.get("host"),
            ranks=[found["rank"]] if isinstance(found.get("rank"), int) else [],
            step_first=first,
            step_last=last,
            kinds=[found["kind"]] if found.get("kind") else [],
            tags=tags,
            summary=summary,
            events=[found],
            context=captured,
        )
        return self.open_incident(draft)

    def attach_events(
        self,
        ref: Ref,
        events: Sequence[capture.EventLike],
        *,
        run: str | None = None,
        host: str | None = None,
        metrics: capture.MetricSeries | None = None,
        gpu_devices: Iterable[capture.DeviceLike] = (),
        window: int = capture.DEFAULT_WINDOW,
    ) -> list[Entry]:
        """Add events to an incident (each once), with a new metrics window / GPU state if given."""
        found = [capture.as_event(event, run=run, host=host) for event in events]
        captured = capture.capture(found, metrics=metrics, gpu_devices=gpu_devices, window=window)
        with self._lock:
            return incidents.attach(self._db, self._number(ref), found, captured, self.author)

    def add_note(self, ref: Ref, text: str) -> Entry:
        return self._add(ref, "note", text)

    def add_result(self, ref: Ref, text: str) -> Entry:
        """What was observed (e.g. "loss back to 2.1 after 300 steps")."""
        return self._add(ref, "result", text)

    def add_tried(self, ref: Ref, text: str, outcome: str = "unknown", *, step: int | None = None) -> Entry:
        """What was tried and what it did: helped, no_effect, made_worse or unknown (for now)."""
        return self._add(ref, "tried", text, outcome=outcome, step=step)

    def _add(self, ref: Ref, entry_type: str, text: str, **extra: Any) -> Entry:
        with self._lock:
            number = self._number(ref)
            return incidents.add_entry(self._db, number, entry_type, text, self.author, **extra)

    def set_status(self, ref: Ref, status: str, *, note: str = "") -> Entry | None:
        """Change the status; returns the status-change entry, or None if it already had it."""
        with self._lock:
            return incidents.set_status(
                self._db, self._number(ref), status, self.author, note=note
            )

    def update(
        self,
        ref: Ref,
        *,
        add_tags: Iterable[str] = (),
        remove_tags: Iterable[str] = (),
        add_kinds: Iterable[str] = (),
        **fields: Any,
    ) -> Incident:
        """Edit fields (title, severity, run, host, summary, trigger, detection, root_cause, resolution)."""
        with self._lock:
            return incidents.update(
                self._db,
                self._number(ref),
                self.author,
                fields=fields,
                add_tags=add_tags,
                remove_tags=remove_tags,
                add_kinds=add_kinds,
            )

    def tick_step(self, ref: Ref, runbook: str, step_id: str, *, checked: bool = True) -> Entry:
        """Tick (or untick) a runbook step: a "runbook_step" timeline entry records who and when."""
        book = self.runbooks.runbooks.get(runbook)
        if book is None:
            raise UserError(f"no runbook {runbook!r} (loaded: {', '.join(sorted(self.runbooks.runbooks))})")
        step = book.step(step_id)
        if step is None:
            raise UserError(
                f"runbook {runbook!r} has no step {step_id!r} (steps: "
                f"{', '.join(s.id for s in book.steps())})"
            )
        data = {
            "runbook": runbook,
            "step": step.id,
            "checked": checked,
            "group": step.group,
            "text": step.text,
        }
        with self._lock:
            number = self._number(ref)
            return incidents.add_entry(self._db, number, "runbook_step", "", self.author, data=data)

    # -- Markdown ------------------------------------------------------------------------------

    def render(self, ref: Ref) -> str:
        """The incident as the Markdown an export writes."""
        with self._lock, kbdb.read(self._db):
            number = self._number(ref)
            return render(
                incidents.get(self._db, number),
                incidents.timeline(self._db, number),
                incidents.context(self._db, number),
                self.runbooks,
            )

    def export(
        self, folder: Path, refs: Sequence[Ref] = (), *, on_progress: Callable[[int, int], None] | None = None
    ) -> ExportReport:
        """Write one Markdown file per incident (all of them when ``refs`` is empty) into ``folder``."""
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create {folder}: {exc.strerror}") from None
        with self._lock:
            numbers = (
                [self._number(ref) for ref in refs]
                if refs
                else incidents.all_numbers(self._db)
            )
        target = ExportFolder(folder)
        for done, number in enumerate(dict.fromkeys(numbers), 1):
            with self._lock, kbdb.read(self._db):
                incident = incidents.get(self._db, number)
                text = render(
                    incident,
                    incidents.timeline(self._db, number),
                    incidents.context(self._db, number),
                    self.runbooks,
                )
            target.write(incident, text)
            if on_progress is not None:
                on_progress(done, len(numbers))
        return target.report

    def import_files(self, paths: Iterable[Path]) -> ImportReport:
        """Merge exported files (or every ``*.md`` of a folder) by incident UUID.

        A file with a problem is reported with its line and skipped; the others still import.
        """
        report = ImportReport()
        for path in _markdown_files(paths):
            try:
                parsed = parse_file(path)
                with self._lock:
                    outcome = incidents.merge(self._db, parsed.incident, parsed.entries, parsed.context)
            except ParseError as exc:
                report.problems.append(FileProblem(path, exc.line, str(exc)))
                continue
            except OSError as exc:
                report.problems.append(FileProblem(path, 1, f"cannot read: {exc.strerror}"))
                continue
            except (UserError, ValueError, OverflowError, RecursionError, sqlite3.Error) as exc:
                # Each file stands alone: whatever one holds, the others are still imported.
                report.problems.append(FileProblem(path, 1, f"not imported: {exc}"))
                continue
            report.imported.append((path, outcome))
        return report


def _markdown_files(paths: Iterable[Path]) -> list[Path]:
    """Files as given; folders as their ``*.md`` files (a README is not an incident)."""
    files = []
    for path in paths:
        if path.is_dir():
            files += [p for p in sorted(path.glob("*.md")) if p.name.lower() != "readme.md"]
        elif path.exists():
            files.append(path)
        else:
            raise UserError(f"no such file or folder: {path}")
    return files
