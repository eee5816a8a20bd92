"""The Markdown incident file format: the one definition the exporter writes and the importer reads.

Design rules, so that export -> import -> export gives the same bytes and a person can read and
review the file in git:

- Single-line fields are list items ``- **Label:** value``; the importer reads the raw source of
  the item, so a value holding ``|``, ``*`` or backticks comes back exactly.
- Free text (summary, root cause, notes) is a blockquote: every line prefixed with ``> ``, read
  back from the source lines, so text may hold anything, headings and fences included.
- Structured data (the event, the metrics window) is a fenced ``json`` block with sorted keys.
- Sections that are views of other data ("What was tried", "Runbook progress", the tables under
  "Context") are regenerated on export and ignored on import.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from tuimon.kb.model import TEXT_FIELD_LABELS, Incident

#: Single-line incident fields, in file order: label -> attribute.
FIELD_LABELS = {
    "ID": "id",
    "Number": "number",
    "Title": "title",
    "Status": "status",
    "Severity": "severity",
    "Run": "run",
    "Host": "host",
    "Ranks": "ranks",
    "Steps": "steps",
    "Kinds": "kinds",
    "Tags": "tags",
    "Created": "created_at",
    "Created by": "created_by",
    "Updated": "updated_at",
    "Updated by": "updated_by",
    "Resolved": "resolved_at",
    "Resolved by": "resolved_by",
}
#: Labels of an entry's metadata list, and of a context record's.
ENTRY_LABELS = {"Entry": "id", "Outcome": "outcome", "Step": "step"}
CONTEXT_LABELS = {"Context": "id"}

TEXT_SECTIONS = {label: name for name, label in TEXT_FIELD_LABELS.items()}
TRIED_SECTION = "What was tried"
PROGRESS_SECTION = "Runbook progress"
TIMELINE_SECTION = "Timeline"
CONTEXT_SECTION = "Context"
#: Sections regenerated from other data on export and skipped on import.
DERIVED_SECTIONS = (TRIED_SECTION, PROGRESS_SECTION)
SECTION_ORDER = (*TEXT_SECTIONS, TRIED_SECTION, PROGRESS_SECTION, TIMELINE_SECTION, CONTEXT_SECTION)

#: Between the parts of an entry or context heading: ``### time · type · author``.
HEADING_SEPARATOR = " · "
EMPTY_TEXT = "_Not recorded._"
NO_ENTRIES = "_No entries._"
NO_CONTEXT = "_Nothing captured._"
LIST_SEPARATOR = ", "

_ITEM = re.compile(r"\*\*(?P<label>[^*]+):\*\*(?: (?P<value>.*))?", re.DOTALL)
ID_LINE = re.compile(r"^- \*\*ID:\*\* (?P<id>\S+)$", re.MULTILINE)


def field_item(label: str, value: str) -> str:
    return f"- **{label}:** {value}".rstrip()


def parse_item(content: str) -> tuple[str, str] | None:
    """(label, value) of a ``**Label:** value`` list item's raw content, or None."""
    match = _ITEM.fullmatch(content.strip())
    if not match:
        return None
    return match.group("label"), (match.group("value") or "").strip()


def blockquote(text: str) -> str:
    """Text as a blockquote that gives back exactly ``text`` (see :func:`unquote`)."""
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def unquote(lines: list[str]) -> str:
    """The inverse of :func:`blockquote`, on the blockquote's source lines."""
    out = []
    for line in lines:
        if line.startswith("> "):
            out.append(line[2:])
        elif line.startswith(">"):
            out.append(line[1:])
        else:
            out.append(line)  # a lazy continuation line someone typed by hand
    return "\n".join(out)


def json_block(data: Any) -> str:
    return "```json\n" + _json_text(data, 0) + "\n```"


def _json_text(value: Any, level: int) -> str:
    """Indented JSON with sorted keys, but a list of plain values on one line: a metrics window
    stays a few lines long instead of one line per number."""
    inner, outer = "  " * (level + 1), "  " * level
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {_json_text(value[k], level + 1)}"
            for k in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + f"\n{outer}}}"
    if isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        return "[\n" + ",\n".join(inner + _json_text(item, level + 1) for item in value) + f"\n{outer}]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def steps_text(first: int | None, last: int | None, *, grouped: bool = False, missing: str = "") -> str:
    """A step range, ``12-15`` (``12,000-12,015`` when ``grouped``, for the screen; files keep plain
    digits so that import reads them back); one step alone when ``last`` is it or unknown."""
    if first is None:
        return missing
    spell = "{:,}".format if grouped else str
    return spell(first) if first == last or last is None else f"{spell(first)}-{spell(last)}"


def table_cell(text: Any) -> str:
    """A value for a (derived) table cell: one line, pipes escaped."""
    return " ".join(str("" if text is None else text).split()).replace("\\", "\\\\").replace("|", "\\|")


def slug(title: str, limit: int = 60) -> str:
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    words = re.sub(r"[^a-z0-9]+", "-", ascii_title.lower()).strip("-")
    if len(words) > limit:
        words = words[:limit].rsplit("-", 1)[0]
    return words or "incident"


def file_name(incident: Incident) -> str:
    """``0012-loss-spike-at-step-12000.md``: sorts by number, says what it is."""
    return f"{incident.number:04d}-{slug(incident.title)}.md"
