"""Two versions of one incident, merged against the version they both started from.

Used when ``git pull --rebase`` stops on an incident file that two hosts changed. git merges
lines (https://git-scm.com/docs/git-merge-file), and for these files that always collides: both
sides rewrite the ``Updated`` line, and two notes appended to one timeline land on the same lines.
Merging the parsed incidents instead applies the same three-way rule field by field:

- the timeline and the captured context are unions by id, so everybody's entries are kept;
- a field changed on one side only takes that side's value; kinds, tags and ranks keep what
  either side added and drop what either side removed;
- a field both sides changed takes the value of the side updated later, except the free-text
  fields (summary, trigger, detection, root cause, resolution): two different texts written
  since the common version are a conflict for people to settle, never silently dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from tuimon.kb import model
from tuimon.kb.markdown_import import ParsedIncident
from tuimon.kb.model import Incident

#: Single-valued fields, grouped where they change together (a status with its resolution).
_SCALARS = (
    ("title",),
    ("severity",),
    ("run",),
    ("host",),
    ("step_first", "step_last"),
    ("status", "resolved_at", "resolved_by"),
)
_SETS = ("ranks", "kinds", "tags")
#: Stands for the base when the two versions share none (both sides added the file).
_NO_BASE = object()
_CONFLICT = object()

T = TypeVar("T")


class _Record(Protocol):
    @property
    def id(self) -> str: ...


R = TypeVar("R", bound=_Record)


@dataclass(frozen=True)
class Merged:
    """The merged version, or the free-text fields (attribute names) both sides changed differently."""

    version: ParsedIncident | None
    conflicts: tuple[model.TextField, ...] = ()


def merge(base: Incident | None, local: ParsedIncident, other: ParsedIncident, author: str) -> Merged:
    """Merge ``other``'s version of an incident into ``local``'s (same id); ``base`` is their common
    version, if any. ``author`` signs a result that differs from both sides."""
    mine, theirs = local.incident, other.incident
    later = theirs if theirs.updated_at > mine.updated_at else mine
    values: dict[str, Any] = {}
    conflicts = []
    for group in _SCALARS:
        value = _three_way(*(_fields(version, group) for version in (base, mine, theirs)))
        values.update(zip(group, _fields(later, group) if value is _CONFLICT else value, strict=True))
    for text_field in model.TEXT_FIELDS:
        value = _three_way(*(_fields(version, (text_field,)) for version in (base, mine, theirs)))
        if value is _CONFLICT:
            conflicts.append(text_field)
        else:
            values[text_field] = value[0]
    if conflicts:
        return Merged(None, tuple(conflicts))
    for name in _SETS:
        kept = _set_union(getattr(base, name) if base else None, getattr(mine, name), getattr(theirs, name))
        values[name] = tuple(sorted(kept)) if name == "ranks" else kept
    unchanged = dataclasses.replace(later, number=mine.number)
    incident = dataclasses.replace(unchanged, **values)
    if incident != unchanged:
        incident = dataclasses.replace(incident, updated_at=_after(later.updated_at), updated_by=author)
    entries = _union_by_id(local.entries, other.entries, key=lambda entry: entry.time)
    context = _union_by_id(local.context, other.context, key=lambda record: record.captured_at)
    return Merged(ParsedIncident(incident, entries, context))


def _fields(incident: Incident | None, names: tuple[str, ...]) -> Any:
    return _NO_BASE if incident is None else tuple(getattr(incident, name) for name in names)


def _three_way(base: Any, mine: Any, theirs: Any) -> Any:
    """The merged value, or ``_CONFLICT`` when each side changed it its own way."""
    if mine == theirs or theirs == base:
        return mine
    if mine == base:
        return theirs
    return _CONFLICT


def _set_union(base: tuple[T, ...] | None, mine: tuple[T, ...], theirs: tuple[T, ...]) -> tuple[T, ...]:
    """What either side has, less what one side removed from the base (order: mine, then theirs)."""
    removed = {item for item in base or () if item not in mine or item not in theirs}
    return tuple(item for item in dict.fromkeys((*mine, *theirs)) if item not in removed)


def _union_by_id(first: Iterable[R], second: Iterable[R], *, key: Callable[[R], str]) -> tuple[R, ...]:
    """Records of both sides, each id once, in time order (entries are append-only: same id, same entry)."""
    merged: dict[str, R] = {item.id: item for item in first}
    for item in second:
        merged.setdefault(item.id, item)
    return tuple(sorted(merged.values(), key=key))


def _after(stamp: str) -> str:
    """Now, or just after ``stamp`` if this host's clock is behind: a merge that differs from both
    sides is a new version, and import lets the more recently updated version's fields win."""
    now = model.now()
    if now > stamp:
        return now
    return model.format_time(datetime.fromisoformat(stamp.replace("Z", "+00:00")) + timedelta(milliseconds=1))
