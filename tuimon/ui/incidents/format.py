"""Text of the incident views: status and outcome labels, list rows, search snippets, the incident's
fields, its timeline, its captured evidence and "seen before".

Like the dashboard's panels, every state is a symbol and a word besides its colour. Times are
stored in UTC and shown in the viewer's local time, which is what people compare with their logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from textual.content import Content

from tuimon.kb import ContextRecord, Entry, Incident, SearchHit, SeenBefore, Snippet
from tuimon.kb.markdown import markdown_parser
from tuimon.kb.mdformat import steps_text
from tuimon.kb.model import OUTCOME_LABELS, TEXT_FIELD_LABELS, TEXT_FIELDS
from tuimon.ui.format import labelled, severity

#: status -> (label with symbol, style)
STATUS_STYLE = {
    "open": ("● OPEN", "bold $error"),
    "investigating": ("◐ INVESTIGATING", "bold $warning"),
    "mitigated": ("◑ MITIGATED", "bold $accent"),
    "resolved": ("✔ RESOLVED", "bold $success"),
}
#: outcome -> (symbol, style); the words are :data:`tuimon.kb.model.OUTCOME_LABELS`.
OUTCOME_STYLE = {
    "helped": ("✔", "bold $success"),
    "no_effect": ("○", "$foreground 70%"),
    "made_worse": ("✖", "bold $error"),
    "unknown": ("?", "$warning"),
}
#: How a matched word of a search snippet is shown.
HIGHLIGHT_STYLE = "bold reverse $accent"
#: Characters of a title shown in the incident list (the detail shows all of it).
LIST_TITLE_CHARS = 54
#: Characters of a git commit shown (enough to find it; the export keeps all of it).
COMMIT_CHARS = 12
_DIM = "$foreground 60%"
#: Reads runbook steps' inline Markdown (:func:`inline_markdown`).
_INLINE = markdown_parser()


def status_label(status: str) -> Content:
    """An incident's status (open, investigating, mitigated, resolved) with its symbol."""
    return labelled(status, STATUS_STYLE)


def outcome_label(outcome: str | None) -> Content:
    key = outcome or "unknown"
    symbol, style = OUTCOME_STYLE.get(key, ("?", ""))
    return Content.styled(f"{symbol} {OUTCOME_LABELS.get(key, key)}", style)


def local_time(stamp: str | None, *, seconds: bool = False) -> str:
    """A stored UTC time as local ``MM-DD HH:MM`` (the year only when it is not this year)."""
    if not stamp:
        return "—"
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone()
    layout = "%m-%d %H:%M:%S" if seconds else "%m-%d %H:%M"
    if moment.year != datetime.now().year:
        layout = "%Y-" + layout
    return moment.strftime(layout)


def inline_markdown(text: str) -> Content:
    """A line of Markdown as it reads, not as it is typed: ``**before**`` bold, ``*why*`` italic,
    `code` spans (runbooks name metrics and kinds with them) in the accent colour, a link's text
    underlined; CommonMark's inline rules, by markdown-it-py."""
    styles = {"strong": "bold", "em": "italic", "link": "underline", "s": "strike"}
    parts: list[Content] = []
    open_styles: list[str] = []
    for token in _INLINE.parseInline(" ".join(text.split()))[0].children or []:
        kind, _, edge = token.type.rpartition("_")
        if kind in styles and edge in ("open", "close"):
            if edge == "open":
                open_styles.append(styles[kind])
            elif styles[kind] in open_styles:
                open_styles.remove(styles[kind])
        elif token.type in ("text", "code_inline", "softbreak", "hardbreak", "html_inline"):
            piece = " " if token.type.endswith("break") else token.content
            style = " ".join([*open_styles, *(["$accent"] if token.type == "code_inline" else [])])
            parts.append(Content.styled(piece, style) if style else Content(piece))
    return Content("").join(parts)


def incident_row(incident: Incident) -> Content:
    """Two lines of the incident list: number, status, severity, last activity; then the title."""
    kinds = ", ".join(incident.kinds)
    first = Content.assemble(
        (f"#{incident.number:<4}", "bold"),
        " ",
        status_label(incident.status),
        "  ",
        severity(incident.severity),
        ("  " + local_time(incident.updated_at), _DIM),
        (f"  {kinds}" if kinds else "", "$accent"),
    )
    title = incident.title
    if len(title) > LIST_TITLE_CHARS:
        title = title[: LIST_TITLE_CHARS - 1] + "…"
    return Content("\n").join([first, Content("      " + title)])


def snippet_content(snippet: Snippet) -> Content:
    """A search snippet with the matched words highlighted."""
    return Content.assemble(*((text, HIGHLIGHT_STYLE) if hit else text for text, hit in snippet.segments))


def hit_row(hit: SearchHit) -> Content:
    """An incident row plus where the best match is and its snippet."""
    where = hit.matched.replace("_", " ")
    if hit.outcome:
        where += f" ({OUTCOME_LABELS.get(hit.outcome, hit.outcome)})"
    match = Content.assemble(("      " + where + ": ", _DIM), snippet_content(hit.snippet))
    return Content("\n").join([incident_row(hit.incident), match])


def incident_summary(incident: Incident, records: Sequence[ContextRecord]) -> Content:
    """The detail's top: title, state, where and when, the postmortem fields filled in, evidence."""
    fields = [
        ("run", incident.run or "—"),
        ("host", incident.host or "—"),
        ("ranks", ", ".join(map(str, incident.ranks)) or "—"),
        ("steps", steps_text(incident.step_first, incident.step_last, grouped=True, missing="—")),
    ]
    lines = [
        Content.assemble((f"#{incident.number} ", "bold $primary"), (incident.title, "bold")),
        Content.assemble(
            status_label(incident.status),
            "  ",
            severity(incident.severity),
            "  ",
            Content("  ").join(Content.assemble((f"{name} ", _DIM), value) for name, value in fields),
        ),
        Content.assemble(
            ("kinds ", _DIM),
            (", ".join(incident.kinds) or "—", "$accent"),
            ("   tags ", _DIM),
            ", ".join(incident.tags) or "—",
        ),
        Content.styled(
            f"opened {local_time(incident.created_at)} by {incident.created_by} · "
            f"updated {local_time(incident.updated_at)} by {incident.updated_by}"
            + (
                f" · resolved {local_time(incident.resolved_at)} by {incident.resolved_by}"
                if incident.resolved_at
                else ""
            ),
            _DIM,
        ),
    ]
    for name in TEXT_FIELDS:
        text = getattr(incident, name)
        if text:
            lines.append(Content.assemble((f"{TEXT_FIELD_LABELS[name]}: ", "bold"), " ".join(text.split())))
    evidence = evidence_text(records)
    if evidence:
        lines.append(Content.assemble(("Evidence: ", "bold"), (evidence, _DIM)))
    return Content("\n").join(lines)


def evidence_text(records: Iterable[ContextRecord]) -> str:
    """One line on what was captured: the metrics window, the GPUs, the reproduction record."""
    parts = []
    for record in records:
        data: Mapping[str, Any] = record.data
        if record.kind == "metrics":
            steps = data.get("steps") or []
            span = f"steps {steps[0]:,}-{steps[-1]:,}" if steps else "no steps"
            parts.append(f"metrics {span} ({', '.join(data.get('series', {}))})")
        elif record.kind == "gpu":
            parts.append(f"GPU state ({len(data.get('devices', []))} devices)")
        elif record.kind == "reproduction":
            known = [
                f"{key} {str(data[key])[:COMMIT_CHARS]}"
                for key in ("seed", "git_commit", "config_hash")
                if data.get(key) is not None
            ]
            parts.append("reproduction record" + (f" ({', '.join(known)})" if known else ""))
    return "; ".join(parts)


def entry_line(entry: Entry) -> Content:
    """One timeline entry: local time, who, what."""
    head = Content.assemble(
        (local_time(entry.time, seconds=True), _DIM), " ", (f"{entry.author:<10}", "bold"), " "
    )
    data: Mapping[str, Any] = entry.data or {}
    if entry.type == "tried":
        at = f" (at step {entry.step:,})" if entry.step is not None else ""
        body = Content.assemble(
            ("tried ", "bold"), outcome_label(entry.outcome), "  ", entry.text, (at, _DIM)
        )
    elif entry.type == "status_change":
        body = Content.assemble(
            ("status ", "bold"),
            status_label(str(data.get("from", "?"))),
            " → ",
            status_label(str(data.get("to", "?"))),
            (f"  {entry.text}" if entry.text else ""),
        )
    elif entry.type == "runbook_step":
        ticked = bool(data.get("checked"))
        body = Content.assemble(
            ("☑ ticked " if ticked else "☐ unticked ", "bold $success" if ticked else "bold"),
            (f"{data.get('runbook')}/{data.get('step')} ", _DIM),
            inline_markdown(str(data.get("text", ""))),
        )
    elif entry.type == "event":
        step = data.get("step")
        at = f" at step {step:,}" if isinstance(step, int) else ""
        body = Content.assemble(
            ("event ", "bold"),
            severity(str(data.get("severity", "info"))),
            f" {data.get('kind', '')}{at}: {entry.text}",
        )
    else:
        label = "result" if entry.type == "result" else "note"
        body = Content.assemble((f"{label} ", "bold $primary"), entry.text)
    return head + body


def timeline_content(entries: Sequence[Entry]) -> Content:
    if not entries:
        return Content.styled("nothing yet: a adds a note, t something tried", _DIM)
    return Content("\n").join(entry_line(entry) for entry in entries)


def seen_before_content(seen: SeenBefore, *, recorded: bool = False) -> Content:
    """``seen before: 3 incidents, 2 resolved`` and what was tried, what helped first; ``recorded``:
    the event is in an incident already (which is not counted as seen before)."""
    if not seen.total:
        other = "no other incident of this kind" if recorded else "not seen before"
        return Content.styled(f"{other} in this knowledge base", _DIM)
    noun = "incident" if seen.total == 1 else "incidents"
    numbers = ", ".join(incident.ref for incident in seen.incidents)
    parts = [
        Content.assemble(
            ("Seen before: ", "bold $warning"),
            (f"{seen.total} {noun}, {seen.resolved} resolved", "bold"),
            (f" ({numbers})" if numbers else "", _DIM),
        )
    ]
    for remedy in seen.remedies[:4]:
        refs = " ".join(f"#{number}" for number in remedy.incidents)
        times = f" {remedy.times}x" if remedy.times > 1 else ""
        parts.append(
            Content.assemble(outcome_label(remedy.outcome), f": {remedy.text}", (f"{times} {refs}", _DIM))
        )
    return Content(" · ").join(parts)
