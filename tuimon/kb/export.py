"""Incidents to Markdown files: one file per incident, every field, readable on GitHub, re-importable.

The format is defined in :mod:`tuimon.kb.mdformat`. Export is deterministic (same incident, same
bytes), writes only files whose content changed (quiet ``git status``), and when a title changes
it replaces the incident's old file instead of leaving a stale copy next to the new one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuimon.kb import mdformat as fmt
from tuimon.kb.capture import STANDARD_METRICS
from tuimon.kb.model import OUTCOME_LABELS, TEXT_FIELD_LABELS, TEXT_FIELDS, ContextRecord, Entry, Incident
from tuimon.kb.runbooks import RunbookLibrary, progress

#: Rows of a metrics window shown as a table (the whole window is in the JSON block below it).
METRICS_TABLE_ROWS = 41


def render(
    incident: Incident, entries: Sequence[Entry], records: Sequence[ContextRecord], library: RunbookLibrary
) -> str:
    """The Markdown file of one incident."""
    parts = [f"# {incident.ref} {incident.title}", _fields(incident)]
    for name in TEXT_FIELDS:
        text = getattr(incident, name)
        parts += [f"## {TEXT_FIELD_LABELS[name]}", fmt.blockquote(text) if text else fmt.EMPTY_TEXT]
    parts += [f"## {fmt.TRIED_SECTION}", _tried_table(entries)]
    parts += [f"## {fmt.PROGRESS_SECTION}", *_progress(incident, entries, library)]
    parts.append(f"## {fmt.TIMELINE_SECTION}")
    parts += [_entry(entry) for entry in entries] or [fmt.NO_ENTRIES]
    parts.append(f"## {fmt.CONTEXT_SECTION}")
    parts += [_context(record) for record in records] or [fmt.NO_CONTEXT]
    return "\n\n".join(parts) + "\n"


def _fields(incident: Incident) -> str:
    values = {
        "id": incident.id,
        "number": str(incident.number),
        "title": incident.title,
        "status": incident.status,
        "severity": incident.severity,
        "run": incident.run or "",
        "host": incident.host or "",
        "ranks": fmt.LIST_SEPARATOR.join(str(rank) for rank in incident.ranks),
        "steps": fmt.steps_text(incident.step_first, incident.step_last),
        "kinds": fmt.LIST_SEPARATOR.join(incident.kinds),
        "tags": fmt.LIST_SEPARATOR.join(incident.tags),
        "created_at": incident.created_at,
        "created_by": incident.created_by,
        "updated_at": incident.updated_at,
        "updated_by": incident.updated_by,
        "resolved_at": incident.resolved_at or "",
        "resolved_by": incident.resolved_by or "",
    }
    return "\n".join(fmt.field_item(label, values[name]) for label, name in fmt.FIELD_LABELS.items())


def _tried_table(entries: Sequence[Entry]) -> str:
    tried = [entry for entry in entries if entry.type == "tried"]
    if not tried:
        return "_Nothing tried yet._"
    rows = ["| When | Who | What was tried | Outcome | At step |", "| --- | --- | --- | --- | --- |"]
    for entry in tried:
        cells = (
            entry.time,
            entry.author,
            entry.text.split("\n", 1)[0],
            OUTCOME_LABELS[entry.outcome or "unknown"],
            entry.step if entry.step is not None else "",
        )
        rows.append("| " + " | ".join(fmt.table_cell(cell) for cell in cells) + " |")
    return "\n".join(rows)


def _progress(incident: Incident, entries: Sequence[Entry], library: RunbookLibrary) -> list[str]:
    ticked_names = {str((e.data or {}).get("runbook")) for e in entries if e.type == "runbook_step"}
    runbooks = {rb.name: rb for rb in library.for_kinds(incident.kinds)}
    runbooks.update({name: library.runbooks[name] for name in ticked_names if name in library.runbooks})
    parts = []
    for name in sorted(runbooks):
        state = progress(runbooks[name], entries)
        lines = [f"### {state.runbook.title} (`{name}`: {state.done} of {len(state.steps)} steps done)", ""]
        for step in state.steps:
            mark = "x" if step.checked else " "
            who = f" ({step.by}, {step.at})" if step.checked else ""
            text = " ".join(step.step.text.split())
            lines.append(f"- [{mark}] `{step.step.id}` {step.step.group} · {text}{who}")
        parts.append("\n".join(lines))
    for name in sorted(ticked_names - set(runbooks)):
        parts.append(f"### `{name}` (runbook not available here; ticks are in the timeline)")
    return parts or ["_No runbook matches this incident's kinds._"]


def _entry(entry: Entry) -> str:
    heading = fmt.HEADING_SEPARATOR.join((entry.time, entry.type, entry.author))
    meta = [fmt.field_item("Entry", entry.id)]
    if entry.outcome is not None:
        meta.append(fmt.field_item("Outcome", entry.outcome))
    if entry.step is not None:
        meta.append(fmt.field_item("Step", str(entry.step)))
    parts = [f"### {heading}", "\n".join(meta)]
    if entry.text:
        parts.append(fmt.blockquote(entry.text))
    if entry.data is not None:
        parts.append(fmt.json_block(entry.data))
    return "\n\n".join(parts)


def _context(record: ContextRecord) -> str:
    heading = fmt.HEADING_SEPARATOR.join((record.kind, record.captured_at, record.author))
    parts = [f"### {heading}", fmt.field_item("Context", record.id)]
    view = _CONTEXT_VIEWS.get(record.kind)
    table = view(record.data) if view else ""
    if table:
        parts.append(table)
    parts.append(fmt.json_block(record.data))
    return "\n\n".join(parts)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(fmt.table_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _metrics_view(data: Any) -> str:
    steps = data.get("steps") or []
    series = data.get("series") or {}
    if not steps or not series:
        return ""
    stride = max(1, -(-len(steps) // METRICS_TABLE_ROWS))
    event_steps = set(data.get("event_steps") or [])
    shown = [i for i, step in enumerate(steps) if i % stride == 0 or step in event_steps]
    names = [name for name in STANDARD_METRICS if name in series] + sorted(
        set(series) - set(STANDARD_METRICS)
    )
    rows = [
        [f"**{steps[i]}**" if steps[i] in event_steps else steps[i], *(series[n][i] for n in names)]
        for i in shown
    ]
    return _table(["step", *names], rows)


def _gpu_view(data: Any) -> str:
    devices = data.get("devices") or []
    if not devices:
        return ""

    def gib(value: Any) -> str:
        return f"{value / 2**30:.1f}" if isinstance(value, int | float) else ""

    rows = [
        [
            d.get("host"),
            d.get("rank"),
            d.get("index"),
            d.get("name"),
            d.get("util"),
            f"{gib(d.get('mem_used'))} / {gib(d.get('mem_total'))}",
            d.get("temp_c"),
            d.get("power_w"),
            ", ".join(d.get("throttle") or []),
            d.get("ecc_errors"),
        ]
        for d in devices
    ]
    return _table(
        ["host", "rank", "gpu", "name", "util %", "mem GiB", "temp °C", "power W", "throttle", "ecc"], rows
    )


def _reproduction_view(data: Any) -> str:
    versions = data.get("versions") or {}
    rows = [
        ["seed", data.get("seed")],
        ["config hash", data.get("config_hash")],
        ["git commit", data.get("git_commit")],
        ["world size", data.get("world_size")],
        ["command", " ".join(str(a) for a in data.get("argv") or [])],
        *([f"{name} version", value] for name, value in sorted(versions.items())),
    ]
    return _table(["field", "value"], [row for row in rows if row[1] not in (None, "")])


_CONTEXT_VIEWS: dict[str, Callable[[Any], str]] = {
    "metrics": _metrics_view,
    "gpu": _gpu_view,
    "reproduction": _reproduction_view,
}


# -- writing a folder -----------------------------------------------------------------------------


@dataclass
class ExportReport:
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)


class ExportFolder:
    """A folder of exports being (re)written: knows which file holds which incident.

    Files are found by their ID line, not their name, so a renamed incident replaces its old file
    and two knowledge bases exporting into one git folder never overwrite each other's incidents
    (a clash of number and title gets the UUID's first characters appended).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.report = ExportReport()
        self._files: dict[str, Path] = {}
        self._owners: dict[str, str] = {}
        for path in sorted(folder.glob("*.md")):
            try:
                head = path.read_text(encoding="utf-8", errors="replace")[:4096]
            except OSError:
                continue
            match = fmt.ID_LINE.search(head)
            if match:
                self._files[match.group("id")] = path
                self._owners[path.name] = match.group("id")

    @property
    def paths(self) -> dict[str, Path]:
        """Incident id -> the file that holds it (found by its ID line, or written since)."""
        return dict(self._files)

    def write(self, incident: Incident, text: str) -> Path:
        name = fmt.file_name(incident)
        if self._owners.get(name, incident.id) != incident.id:
            name = f"{name[:-3]}-{incident.id[:8]}.md"
        self._owners[name] = incident.id
        path = self.folder / name
        (self.report.written if _write_file(path, text) else self.report.unchanged).append(path)
        old = self._files.get(incident.id)
        if old is not None and old != path:
            old.unlink(missing_ok=True)
            self.report.removed.append(old)
        self._files[incident.id] = path
        return path


def _write_file(path: Path, text: str) -> bool:
    """Write atomically (a reader, or git, never sees half a file); False when unchanged."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return True
