"""What an incident is: its records, the allowed values, and how user input is normalised.

Every path that writes (CLI, dashboard, Markdown import) goes through the same normalisers, so an
incident typed on the command line, opened from an event or read back from an export compares
equal field by field; that is what makes export/import round trips exact.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias, TypedDict

from publisher.wire.protocol import SEVERITIES
from publisher.wire.validation import MAX_INT, ProtocolError, check_free_form
from tuimon.errors import UserError

STATUSES = ("open", "investigating", "mitigated", "resolved")
#: Incident severities are the events' severities (an incident is as bad as what triggered it).
SEVERITY_CHOICES: tuple[str, ...] = tuple(SEVERITIES)
#: Timeline entry types. "tried" carries an outcome; "status_change", "event" and
#: "runbook_step" are written by tuimon itself when the status changes, an event is attached or a
#: runbook step is ticked.
ENTRY_TYPES = ("note", "tried", "result", "status_change", "event", "runbook_step")
#: Outcomes of something tried, in the order suggestions show them: what helped first.
OUTCOMES = ("helped", "unknown", "no_effect", "made_worse")
OUTCOME_LABELS = {
    "helped": "helped",
    "unknown": "unknown",
    "no_effect": "no effect",
    "made_worse": "made it worse",
}
#: Free-text fields of an incident, in the order they appear in an export (postmortem order).
TextField: TypeAlias = Literal["summary", "trigger", "detection", "root_cause", "resolution"]
TEXT_FIELDS: tuple[TextField, ...] = ("summary", "trigger", "detection", "root_cause", "resolution")
TEXT_FIELD_LABELS: dict[TextField, str] = {
    "summary": "Summary",
    "trigger": "Trigger",
    "detection": "Detection",
    "root_cause": "Root cause",
    "resolution": "Resolution",
}


class IncidentTexts(TypedDict, total=False):
    """Some of an incident's free-text fields by name (:data:`TEXT_FIELDS`), e.g. those an export
    holds: ``dataclasses.replace(incident, **texts)``."""

    summary: str
    trigger: str
    detection: str
    root_cause: str
    resolution: str


#: Fields :func:`tuimon.kb.incidents.update` may change directly.
EDITABLE_FIELDS = ("title", "severity", "run", "host", *TEXT_FIELDS)

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+-]*")
_NUMBER_REF = re.compile(r"#?(\d+)")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


@dataclass(frozen=True)
class Incident:
    """One incident, as stored. ``number`` is the short human id, ``id`` the stable UUID."""

    id: str
    number: int
    title: str
    status: str
    severity: str
    run: str | None
    host: str | None
    ranks: tuple[int, ...]
    step_first: int | None
    step_last: int | None
    kinds: tuple[str, ...]
    tags: tuple[str, ...]
    summary: str
    trigger: str
    detection: str
    root_cause: str
    resolution: str
    created_at: str
    created_by: str
    updated_at: str
    updated_by: str
    resolved_at: str | None
    resolved_by: str | None

    @property
    def ref(self) -> str:
        """How people refer to it: ``#12``."""
        return f"#{self.number}"

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        for name in ("ranks", "kinds", "tags"):
            data[name] = list(data[name])
        return data


@dataclass(frozen=True)
class Entry:
    """One timeline entry (append-only). ``step`` is where a "tried" change was applied."""

    id: str
    incident: int
    time: str
    author: str
    type: str
    text: str
    outcome: str | None = None
    step: int | None = None
    data: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class ContextRecord:
    """Evidence captured with the incident (metrics window, GPU state, reproduction record).

    Stored in the knowledge base so that it still means something after the run's files are gone.
    """

    id: str
    incident: int
    kind: str
    captured_at: str
    author: str
    data: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


CONTEXT_KINDS = ("metrics", "gpu", "reproduction")


@dataclass
class IncidentDraft:
    """What is known when an incident is opened; everything but the title is optional."""

    title: str
    severity: str = "warning"
    status: str = "open"
    run: str | None = None
    host: str | None = None
    ranks: Iterable[int] = ()
    step_first: int | None = None
    step_last: int | None = None
    kinds: Iterable[str] = ()
    tags: Iterable[str] = ()
    summary: str = ""
    trigger: str = ""
    detection: str = ""
    root_cause: str = ""
    resolution: str = ""
    #: Protocol ``event`` messages that triggered it: each becomes an "event" timeline entry.
    events: list[Mapping[str, Any]] = field(default_factory=list)
    #: Captured context: kind ("metrics", "gpu", "reproduction") -> JSON-safe data.
    context: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def now() -> str:
    """The current UTC time as stored everywhere: ISO 8601, milliseconds, ``Z``."""
    return format_time(datetime.now(UTC))


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def check_time(text: str) -> str:
    """A stored time as read back from a file; raises ValueError when it is not our format."""
    if not _TIME.fullmatch(text):
        raise ValueError(f"time {text!r} is not UTC ISO 8601 like 2025-01-31T12:00:00.000Z")
    return text


def parse_date(text: str, *, end: bool = False) -> str:
    """A date or time typed by a user (``2025-01-31``, ``2025-01-31T12:00``) as a stored time.

    With ``end``, a bare date means the end of that day, so ``--until 2025-01-31`` includes it.
    """
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"not a date: {text!r} (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if end and len(text) == len("YYYY-MM-DD"):
        moment += timedelta(days=1)
    return format_time(moment)


def new_id() -> str:
    return str(uuid.uuid4())


def one_line(text: str | None) -> str:
    """Titles, runs and hosts: one line, single spaces."""
    return " ".join((text or "").split())


def optional_line(text: str | None) -> str | None:
    return one_line(text) or None


def body_text(text: str | None) -> str:
    """Free text (notes, root cause): Unix line ends, no NULs, no surrounding blank space."""
    cleaned = (text or "").replace("\r\n", "\n").replace("\r", "\n").replace("\0", "")
    return "\n".join(line.rstrip() for line in cleaned.strip().split("\n"))


def title_text(text: str | None) -> str:
    title = one_line(text)
    if not title:
        raise UserError("an incident needs a title")
    return title


def choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    """``value`` normalised (case, ``-`` or space for ``_``) if allowed, else a clear error."""
    normal = value.strip().lower().replace("-", "_").replace(" ", "_")
    if normal not in allowed:
        raise UserError(f"unknown {what} {value!r}: use one of {', '.join(allowed)}")
    return normal


def labels(values: Iterable[str], what: str) -> tuple[str, ...]:
    """Kinds or tags: identifiers without spaces or commas, de-duplicated, order kept."""
    seen: dict[str, None] = {}
    for value in values:
        for part in str(value).split(","):
            label = part.strip()
            if not label:
                continue
            if not _LABEL.fullmatch(label):
                raise UserError(f"{what} {label!r} may hold only letters, digits and _ . : / + -")
            seen.setdefault(label, None)
    return tuple(seen)


def whole_number(value: int, what: str) -> int:
    """A step, rank or count as the knowledge base stores it: 0 to 2^63-1 (what SQLite holds)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise UserError(f"{what} must be a whole number from 0 to 2^63-1, not {str(value)[:40]}")
    return value


def ranks(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({whole_number(int(value), "a rank") for value in values}))


def step_range(first: int | None, last: int | None) -> tuple[int | None, int | None]:
    if first is None and last is None:
        return None, None
    first = last if first is None else first
    last = first if last is None else last
    assert first is not None and last is not None
    whole_number(first, "a step")
    whole_number(last, "a step")
    if first > last:
        raise UserError(f"step range {first}-{last} ends before it starts")
    return first, last


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``1200`` or ``1200-1300`` (as typed, and as exports write it); empty means no steps."""
    text = text.strip()
    if not text:
        return None, None
    first, _, last = text.partition("-")
    try:
        return step_range(int(first), int(last or first))
    except ValueError:
        raise UserError(f"steps are FIRST or FIRST-LAST, not {text!r}") from None


def number_ref(ref: str) -> int | None:
    """The number in ``12`` or ``#12``; None when ``ref`` is not a number (then it is a UUID)."""
    match = _NUMBER_REF.fullmatch(ref.strip())
    return int(match.group(1)) if match else None


def evidence(data: Any, what: str) -> Any:
    """Captured data (a context record, an entry's data) within the wire protocol's bounds for
    free-form objects: nesting, size, string lengths. Deeper or larger data is refused here, on
    the way in, so that every later show and export can read it back."""
    try:
        check_free_form(data, what)
    except ProtocolError as exc:
        raise UserError(str(exc)) from None
    return data


def dumps(data: Any) -> str:
    """The one JSON form stored and exported: sorted keys, so equal data gives equal text."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
