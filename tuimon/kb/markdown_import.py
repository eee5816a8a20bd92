"""Markdown incident files back into records (the inverse of :mod:`tuimon.kb.export`).

A file is parsed completely with markdown-it-py before anything is written, so a file with a
problem is reported with its path and line and skipped as a whole; the other files still import.
Values go through the same normalisers as every other write (:mod:`tuimon.kb.model`).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_it.token import Token

from tuimon.errors import UserError
from tuimon.kb import mdformat as fmt
from tuimon.kb import model
from tuimon.kb.markdown import block_end, line_of, markdown_parser
from tuimon.kb.model import ContextRecord, Entry, Incident
from tuimon.kb.problems import LineError

_NOT_AN_EXPORT = "expected the field list ('- **ID:** ...') under the title: is this a tuimon export?"


class ParseError(LineError):
    """A problem in an exported incident file."""


@dataclass(frozen=True)
class ParsedIncident:
    incident: Incident
    entries: tuple[Entry, ...]
    context: tuple[ContextRecord, ...]


def _items(
    tokens: Sequence[Token], start: int, end: int, allowed: dict[str, str]
) -> dict[str, tuple[str, int]]:
    """``**Label:** value`` items of the list tokens[start:end]: attribute -> (value, line)."""
    found: dict[str, tuple[str, int]] = {}
    for token in tokens[start:end]:
        if token.type != "inline" or token.level != 3:  # list > item > paragraph > inline
            continue
        line = line_of(token)
        item = fmt.parse_item(token.content)
        if item is None or item[0] not in allowed:
            raise ParseError(line, f"expected '- **Label:** value' with a label among {', '.join(allowed)}")
        name = allowed[item[0]]
        if name in found:
            raise ParseError(line, f"'{item[0]}' given twice")
        found[name] = (item[1], line)
    return found


def _checked(line: int, convert: Callable[[], Any]) -> Any:
    try:
        return convert()
    except (UserError, ValueError) as exc:
        raise ParseError(line, str(exc)) from None


def _json(token: Token) -> dict[str, Any]:
    if token.info.strip() != "json":
        raise ParseError(line_of(token), "expected a ```json block")
    try:
        data = json.loads(token.content)
    except ValueError as exc:
        line = getattr(exc, "lineno", 1)
        raise ParseError(line_of(token) + line, f"invalid JSON: {exc}") from None
    except RecursionError:
        raise ParseError(line_of(token), "the JSON block is nested too deep") from None
    if not isinstance(data, dict):
        raise ParseError(line_of(token), "the JSON block must hold an object")
    return _checked(line_of(token), lambda: model.evidence(data, "the JSON block"))


def _int(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a whole number") from None
    return model.whole_number(number, "a number")


def _uuid(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise ValueError(f"{text!r} is not a UUID") from None


def _incident(fields: dict[str, tuple[str, int]], line: int) -> Incident:
    for required in (
        "id",
        "number",
        "title",
        "status",
        "severity",
        "created_at",
        "created_by",
        "updated_at",
        "updated_by",
    ):
        if not fields.get(required, ("", 0))[0]:
            label = next(label for label, name in fmt.FIELD_LABELS.items() if name == required)
            raise ParseError(line, f"missing '- **{label}:**' field")

    def value(name: str, convert: Callable[[str], Any]) -> Any:
        text, at = fields.get(name, ("", line))
        return _checked(at, lambda: convert(text))

    def optional_time(text: str) -> str | None:
        return model.check_time(text) if text else None

    first, last = value("steps", model.parse_steps)
    return Incident(
        id=value("id", _uuid),
        number=value("number", _int),
        title=value("title", model.title_text),
        status=value("status", lambda t: model.choice(t, model.STATUSES, "status")),
        severity=value("severity", lambda t: model.choice(t, model.SEVERITY_CHOICES, "severity")),
        run=value("run", model.optional_line),
        host=value("host", model.optional_line),
        ranks=value("ranks", lambda t: model.ranks(_int(part) for part in t.split(",") if part.strip())),
        step_first=first,
        step_last=last,
        kinds=value("kinds", lambda t: model.labels(t.split(","), "kind")),
        tags=value("tags", lambda t: model.labels(t.split(","), "tag")),
        summary="",
        trigger="",
        detection="",
        root_cause="",
        resolution="",
        created_at=value("created_at", model.check_time),
        created_by=value("created_by", model.one_line),
        updated_at=value("updated_at", model.check_time),
        updated_by=value("updated_by", model.one_line),
        resolved_at=value("resolved_at", optional_time),
        resolved_by=value("resolved_by", model.optional_line),
    )


@dataclass
class _Item:
    """An entry or context record being read: heading parts, metadata, text, data."""

    line: int
    heading: list[str]
    meta: dict[str, tuple[str, int]] | None = None
    text: str = ""
    data: dict[str, Any] | None = None


def _entry(item: _Item) -> Entry:
    time, entry_type, author = item.heading
    meta = item.meta or {}
    if "id" not in meta:
        raise ParseError(item.line, "entry without '- **Entry:** <id>'")
    entry_type = _checked(item.line, lambda: model.choice(entry_type, model.ENTRY_TYPES, "entry type"))
    outcome_text, outcome_line = meta.get("outcome", ("", item.line))
    outcome = (
        _checked(outcome_line, lambda: model.choice(outcome_text, model.OUTCOMES, "outcome"))
        if outcome_text
        else None
    )
    if (outcome is None) != (entry_type != "tried"):
        raise ParseError(outcome_line, "a 'tried' entry, and only it, has an '- **Outcome:**'")
    step_text, step_line = meta.get("step", ("", item.line))
    return Entry(
        id=_checked(meta["id"][1], lambda: _uuid(meta["id"][0])),
        incident=0,
        time=_checked(item.line, lambda: model.check_time(time)),
        author=model.one_line(author),
        type=entry_type,
        text=item.text,
        outcome=outcome,
        step=_checked(step_line, lambda: _int(step_text)) if step_text else None,
        data=item.data,
    )


def _record(item: _Item) -> ContextRecord:
    kind, captured_at, author = item.heading
    meta = item.meta or {}
    if "id" not in meta:
        raise ParseError(item.line, "context without '- **Context:** <id>'")
    if item.data is None:
        raise ParseError(item.line, "context without its ```json block")
    return ContextRecord(
        id=_checked(meta["id"][1], lambda: _uuid(meta["id"][0])),
        incident=0,
        kind=_checked(item.line, lambda: model.choice(kind, model.CONTEXT_KINDS, "context kind")),
        captured_at=_checked(item.line, lambda: model.check_time(captured_at)),
        author=model.one_line(author),
        data=item.data,
    )


def parse_incident(text: str) -> ParsedIncident:
    """Read one incident file; raises :class:`ParseError` at the first problem."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    source = text.split("\n")
    tokens = markdown_parser().parse(text)
    fields: dict[str, tuple[str, int]] | None = None
    texts: model.IncidentTexts = {}
    section: str | None = None
    seen: set[str] = set()
    items: dict[str, list[_Item]] = {fmt.TIMELINE_SECTION: [], fmt.CONTEXT_SECTION: []}
    title_line = 1
    index = 0
    while index < len(tokens):
        token = tokens[index]
        end = block_end(tokens, index)
        line = line_of(token)
        heading = tokens[index + 1].content.strip() if token.type == "heading_open" else None
        if token.tag == "h1" and heading is not None:
            if section is not None or fields is not None:
                raise ParseError(line, "the '# title' heading must come first")
            title_line = line
        elif token.tag == "h2" and heading is not None:
            if heading not in fmt.SECTION_ORDER:
                raise ParseError(line, f"unknown section {heading!r}")
            if heading in seen:
                raise ParseError(line, f"section {heading!r} appears twice")
            seen.add(heading)
            section = heading
        elif section is None:
            if token.type != "bullet_list_open" or fields is not None:
                raise ParseError(line, _NOT_AN_EXPORT)
            fields = _items(tokens, index, end, fmt.FIELD_LABELS)
        elif section in fmt.DERIVED_SECTIONS:
            pass  # regenerated on export
        elif section in fmt.TEXT_SECTIONS:
            if token.type == "blockquote_open":
                first, last = token.map or (0, 0)
                texts[fmt.TEXT_SECTIONS[section]] = model.body_text(fmt.unquote(source[first:last]))
            elif not (token.type == "paragraph_open" and tokens[index + 1].content == fmt.EMPTY_TEXT):
                raise ParseError(line, f"section {section!r} holds a '> quoted' text or {fmt.EMPTY_TEXT}")
        else:
            _read_item_part(section, items[section], tokens, index, end, source, heading)
        index = end
    if fields is None:
        raise ParseError(title_line, _NOT_AN_EXPORT)
    incident = dataclasses.replace(_incident(fields, title_line), **texts)
    entries = tuple(_entry(item) for item in items[fmt.TIMELINE_SECTION])
    records = tuple(_record(item) for item in items[fmt.CONTEXT_SECTION])
    for what, group in (("entry", entries), ("context", records)):
        ids = [record.id for record in group]
        if len(ids) != len(set(ids)):
            duplicate = next(i for i in ids if ids.count(i) > 1)
            raise ParseError(title_line, f"{what} id {duplicate} appears twice")
    return ParsedIncident(incident, entries, records)


def _read_item_part(
    section: str,
    items: list[_Item],
    tokens: Sequence[Token],
    index: int,
    end: int,
    source: list[str],
    heading: str | None,
) -> None:
    """One block of the Timeline or Context section."""
    token = tokens[index]
    line = line_of(token)
    placeholder = fmt.NO_ENTRIES if section == fmt.TIMELINE_SECTION else fmt.NO_CONTEXT
    if token.tag == "h3" and heading is not None:
        parts = heading.split(fmt.HEADING_SEPARATOR, 2)
        if len(parts) != 3:
            raise ParseError(
                line, f"expected '### time{fmt.HEADING_SEPARATOR}type{fmt.HEADING_SEPARATOR}author'"
            )
        items.append(_Item(line, parts))
        return
    if token.type == "paragraph_open" and tokens[index + 1].content == placeholder and not items:
        return
    if not items:
        raise ParseError(line, f"'{section}' holds '### ...' items")
    item = items[-1]
    labels = fmt.ENTRY_LABELS if section == fmt.TIMELINE_SECTION else fmt.CONTEXT_LABELS
    if token.type == "bullet_list_open" and item.meta is None:
        item.meta = _items(tokens, index, end, labels)
    elif token.type == "blockquote_open" and section == fmt.TIMELINE_SECTION and not item.text:
        first, last = token.map or (0, 0)
        item.text = model.body_text(fmt.unquote(source[first:last]))
    elif token.type == "fence" and item.data is None:
        item.data = _json(token)
    elif token.type == "table_open" and section == fmt.CONTEXT_SECTION:
        pass  # a view of the JSON below it
    else:
        raise ParseError(
            line, f"unexpected {token.type.removesuffix('_open')} in this {section.lower()} item"
        )


def parse_file(path: Path) -> ParsedIncident:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(1, f"not UTF-8 text ({exc.reason})") from None
    return parse_incident(text)
