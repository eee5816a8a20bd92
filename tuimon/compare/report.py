"""Two runs compared, in one :class:`Comparison`: what ``tuimon diff`` prints, as text or JSON.

Counted as differences (and so exit status 1): the identity (:mod:`tuimon.compare.identity`); the
loss, gradient norm and learning rate curves where they part beyond their own noise
(:mod:`tuimon.compare.curves`); event kinds one run raised and the other did not; invariants one
run violated and the other did not; how the runs ended, when both did. Shown and not counted: the
throughput, and events about speed (:data:`SPEED_KINDS`), since both say as much about the
machine's other load at the time as about the runs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire.protocol import wire_number
from tuimon.compare.curves import SIGMAS, SUSTAIN, WINDOW, Parting, first_parting
from tuimon.compare.identity import IGNORED, Difference, identity_differences
from tuimon.compare.record import RunRecord

#: Curves whose parting counts as a difference.
JUDGED_CURVES = ("loss", "grad_norm", "lr")
#: Event kinds about speed: listed, not counted (they follow the machine's load).
SPEED_KINDS = frozenset({"throughput_drop", "step_time_outlier", "data_bottleneck", "straggler"})
_LABELS = ("A", "B")


@dataclass(frozen=True)
class EventDifference:
    """An event kind that only one run raised (``side`` 0 for A, 1 for B): its first episode, and
    how many episodes and repeats it had."""

    side: int
    kind: str
    severity: str
    step: int | None
    message: str
    episodes: int
    counted: bool


@dataclass(frozen=True)
class Comparison:
    """Everything ``tuimon diff`` says about runs ``a`` and ``b``."""

    a: RunRecord
    b: RunRecord
    identity: list[Difference]
    curves: dict[str, Parting]
    throughput: tuple[str, float, float] | None
    events: list[EventDifference]
    invariants: list[Difference]
    ending: list[Difference]
    notes: list[str] = field(default_factory=list)

    @property
    def counted(self) -> list[str]:
        """What differs beyond noise, one short phrase each."""
        found = [f"{d.section} {d.name}" for d in self.identity]
        found += [f"{name} parts at step {p.first.step}" for name, p in self.curves.items()
                  if p.first is not None and name in JUDGED_CURVES]
        found += [f"{e.kind} only in {_LABELS[e.side]}" for e in self.events if e.counted]
        found += [f"invariant {d.name}" for d in self.invariants]
        found += [f"run {d.name}" for d in self.ending]
        return found

    @property
    def differs(self) -> bool:
        return bool(self.counted)


def compare(a: RunRecord, b: RunRecord) -> Comparison:
    """Compare two runs (``a`` is shown as A, ``b`` as B)."""
    labelled = list(zip(_LABELS, (a, b), strict=True))
    notes = [f"{label}: {note}" for label, record in labelled for note in record.notes]
    for label, record in labelled:
        if record.start is None:
            notes.append(f"{label} has no run_start (the recording began late): its identity is not compared")
        if record.end is None:
            where = f"step {record.last_step}" if record.last_step is not None else "no step yet"
            notes.append(f"{label} has not ended ({where}: still running, or its recording stops short)")
    curves = {
        name: first_parting(a.curves[name], b.curves[name])
        for name in JUDGED_CURVES
        if name in a.curves and name in b.curves
    }
    return Comparison(a, b, identity_differences(a, b), curves, _throughput(a, b), _events(a, b),
                      _invariants(a, b), _ending(a, b), notes)


def _throughput(a: RunRecord, b: RunRecord) -> tuple[str, float, float] | None:
    name = a.throughput
    if name is None or name != b.throughput:
        return None
    medians = []
    for record in (a, b):
        finite = [v for v in record.curves[name].values if math.isfinite(v)]
        if not finite:
            return None
        medians.append(statistics.median(finite))
    return name, medians[0], medians[1]


def _events(a: RunRecord, b: RunRecord) -> list[EventDifference]:
    by_kind = [_kinds(record.events) for record in (a, b)]
    found = []
    for side, (mine, theirs) in enumerate((by_kind, by_kind[::-1])):
        for kind, episodes in mine.items():
            if kind in theirs:
                continue
            first = episodes[0]
            step = first.get("step")
            found.append(EventDifference(
                side, kind, str(first.get("severity")), step if isinstance(step, int) else None,
                str(first.get("message")), len(episodes), kind not in SPEED_KINDS,
            ))
    return found


def _kinds(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    kinds: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        kinds.setdefault(str(event["kind"]), []).append(event)
    return kinds


def _invariants(a: RunRecord, b: RunRecord) -> list[Difference]:
    """Invariants violated (on any rank, at the end) in one run and not in the other."""
    statuses = []
    for record in (a, b):
        worst: dict[str, str] = {}
        for (_, name), message in record.invariants.items():
            if worst.get(name) != "violated":
                worst[name] = str(message["status"])
        statuses.append(worst)
    return [
        Difference("invariants", name, statuses[0].get(name), statuses[1].get(name))
        for name in sorted(set(statuses[0]) | set(statuses[1]))
        if (statuses[0].get(name) == "violated") != (statuses[1].get(name) == "violated")
    ]


def _ending(a: RunRecord, b: RunRecord) -> list[Difference]:
    """How the runs ended, when both did: status and last step."""
    if a.end is None or b.end is None:
        return []
    found = []
    if a.end.get("status") != b.end.get("status"):
        found.append(Difference("run", "status", _end_words(a.end), _end_words(b.end)))
    if a.last_step != b.last_step:
        found.append(Difference("run", "last step", a.last_step, b.last_step))
    return found


def _end_words(end: Mapping[str, Any]) -> str:
    error = end.get("error")
    return f"{end.get('status')}" + (f" ({error})" if error else "")


# ---------------------------------------------------------------------------------------- text


def _show(value: Any, width: int = 60) -> str:
    if value is None:
        text = "(none)"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, list):
        text = " ".join(_show(item, width) for item in value)
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _describe(record: RunRecord) -> str:
    steps = f"{record.last_step} steps" if record.last_step is not None else "no steps"
    end = _end_words(record.end) if record.end is not None else "not ended"
    ranks = f", {len(record.ranks)} ranks (rank {record.rank} compared)" if len(record.ranks) > 1 else ""
    return f"{record.name}  {record.where}  ({steps}, {end}{ranks})"


def render_text(comparison: Comparison) -> str:
    """The comparison as a terminal shows it: what differs, section by section, then the verdict."""
    runs = zip(_LABELS, (comparison.a, comparison.b), strict=True)
    lines = ["tuimon diff", *(f"  {label}  {_describe(record)}" for label, record in runs)]
    differences = [*comparison.identity, *comparison.ending]
    table = [(d.section, d.name, _show(d.a, 40), _show(d.b)) for d in differences]
    if table:
        name_width = min(max(len(row[1]) for row in table), 30)
        value_width = max(len(row[2]) for row in table)
        lines += ["", f"  {'':12} {'':{name_width}}  {'A':{value_width}}   B"]
        previous = None
        for section, name, value_a, value_b in table:
            lines.append(f"  {section if section != previous else '':12} {name:{name_width}}  "
                         f"{value_a:{value_width}} → {value_b}")
            previous = section
    lines += ["", "curves"]
    lines += [f"  {name:14} {_parting_words(parting)}" for name, parting in comparison.curves.items()]
    if not comparison.curves:
        lines.append("  (no curve that both runs measured)")
    if comparison.throughput is not None:
        metric, a, b = comparison.throughput
        ratio = f", B {b / a:.2f}x A" if a > 0 else ""
        lines.append(f"  {metric:14} median A {a:,.0f}/s, B {b:,.0f}/s{ratio} (not judged: speed follows "
                     "the machine's other load)")
    lines.append(f"  (apart: the median difference over the last {WINDOW} steps beyond {SIGMAS:g} standard "
                 f"errors of the runs' own step-to-step noise, {SUSTAIN} steps running)")
    if comparison.events:
        lines += ["", "events"]
        for event in comparison.events:
            step = f" at step {event.step}" if event.step is not None else ""
            times = f", {event.episodes} episodes" if event.episodes > 1 else ""
            aside = "  (speed: not counted)" if not event.counted else ""
            lines.append(f"  only in {_LABELS[event.side]}: {event.kind} ({event.severity}){step}{times}: "
                         f"{_show(event.message, 80)}{aside}")
    if comparison.invariants:
        lines += ["", "invariants (violated in one run only)"]
        lines += [f"  {d.name:28} A {_show(d.a)}, B {_show(d.b)}" for d in comparison.invariants]
    lines += ["", *comparison.notes, f"ignored: {', '.join(IGNORED)}"]
    counted = comparison.counted
    if counted:
        plural = "s" if len(counted) != 1 else ""
        lines.append(f"{len(counted)} difference{plural} beyond noise: " + "; ".join(counted))
    else:
        lines.append("nothing differs beyond noise")
    return "\n".join(lines)


def _parting_words(parting: Parting) -> str:
    first = parting.first
    if first is None:
        return f"within noise over {parting.steps_compared} compared steps"
    if not math.isfinite(first.difference):
        words = f"parts at step {first.step}: A {first.a:.4g}, B {first.b:.4g} (one of them not finite)"
    else:
        words = (f"parts at step {first.step}: A {first.a:.4g}, B {first.b:.4g} (median difference "
                 f"{first.difference:+.3g}, noise allows {first.allowed:.3g})")
    if parting.rejoined is not None:
        words += f"; within noise again from step {parting.rejoined}"
    return words


# ---------------------------------------------------------------------------------------- JSON


def render_json(comparison: Comparison) -> str:
    """The comparison as one JSON object (non-finite numbers as the wire writes them: "nan")."""
    def run(record: RunRecord) -> dict[str, Any]:
        return {"run": record.name, "where": record.where, "rank": record.rank, "last_step": record.last_step,
                "end": record.end.get("status") if record.end is not None else None}

    def parting(p: Parting) -> dict[str, Any]:
        first = p.first
        return {
            "compared_steps": p.steps_compared,
            "parted": None if first is None else {
                "step": first.step, "a": _json(first.a), "b": _json(first.b),
                "difference": _json(first.difference), "allowed": _json(first.allowed),
            },
            "rejoined": p.rejoined,
        }

    def difference(d: Difference) -> dict[str, Any]:
        return {"section": d.section, "name": d.name, "a": _json(d.a), "b": _json(d.b)}

    body = {
        "a": run(comparison.a),
        "b": run(comparison.b),
        "differences": [difference(d) for d in [*comparison.identity, *comparison.ending]],
        "curves": {name: parting(p) for name, p in comparison.curves.items()},
        "throughput": None if comparison.throughput is None else dict(
            zip(("metric", "a", "b"), comparison.throughput, strict=True)),
        "events": [{"only_in": _LABELS[e.side], "kind": e.kind, "severity": e.severity, "step": e.step,
                    "episodes": e.episodes, "message": e.message, "counted": e.counted}
                   for e in comparison.events],
        "invariants": [difference(d) for d in comparison.invariants],
        "notes": comparison.notes,
        "ignored": list(IGNORED),
        "counted": comparison.counted,
        "differs": comparison.differs,
    }
    return json.dumps(body, indent=2, allow_nan=False)


def _json(value: Any) -> Any:
    if isinstance(value, float):
        return wire_number(value)
    if isinstance(value, list):
        return [_json(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json(item) for key, item in value.items()}
    return value
