"""Details of one event: what happened, the numbers the detector saw, where, likely causes, and
the metrics in the steps around it (straight from the store, so it shows what the chart shows)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.widgets import Static

from publisher.wire.event_kinds import EVENT_KINDS
from tuimon.store import EventRecord
from tuimon.ui.dialog import Dialog
from tuimon.ui.format import duration, number, severity

#: Metrics listed in the detail's context table, if the run has them.
CONTEXT_METRICS = ("loss", "grad_norm", "lr", "step_time")
#: Steps listed before and after the event's step.
CONTEXT_STEPS = 5


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return number(value, 6)
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def detail_lines(details: Mapping[str, Any], indent: str = "  ") -> list[Content]:
    """Details as readable lines: lists as bullets, nested objects indented; empty values (null, an
    empty list or object) are left out, as a person would not write them."""
    lines = []
    for key, value in details.items():
        if value is None or (isinstance(value, list | Mapping) and not value):
            continue
        label = key.replace("_", " ")
        if isinstance(value, Mapping):
            lines.append(Content.styled(f"{indent}{label}:", "bold"))
            lines.extend(detail_lines(value, indent + "  "))
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            lines.append(Content.styled(f"{indent}{label}:", "bold"))
            lines.extend(Content(f"{indent}  • {item}") for item in value)
        else:
            lines.append(Content.assemble((f"{indent}{label}: ", "bold"), _value_text(value)))
    return lines


def context_table(window: Mapping[str, tuple[list[int], list[float]]], step: int) -> list[Content]:
    """Metric values at the steps around ``step`` (the event's row marked with ▶)."""
    names = [name for name in CONTEXT_METRICS if window.get(name, ([], []))[0]]
    if not names:
        return [Content.styled("  no metrics recorded around this step", "$foreground 60%")]
    by_step: dict[int, dict[str, float]] = {}
    for name in names:
        for s, v in zip(*window[name], strict=True):
            by_step.setdefault(s, {})[name] = v
    lines = [Content.styled("    step      " + "".join(f"{n:>14}" for n in names), "bold")]
    for s in sorted(by_step):
        row = "".join(f"{number(by_step[s].get(n), 6):>14}" for n in names)
        marker = "▶ " if s == step else "  "
        lines.append(Content.styled(f"  {marker}{s:<8,}{row}", "bold $accent" if s == step else ""))
    return lines


class EventDetailScreen(Dialog[str | None]):
    """One event in full. ``window`` is :meth:`tuimon.store.Store.metric_window` around it;
    ``event_layers``: the layers it names that the run's layer samples hold (``h`` is then offered, and
    the screen is dismissed with ``"layers"`` for the opener to show them)."""

    DEFAULT_CSS = """
    EventDetailScreen > .dialog-box {
        border: thick $accent;
    }
    """
    WIDTH = 110
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("enter", "dismiss", "Close", show=False),
        Binding("h", "layers", "Its layers", tooltip="The layers it names, in the layer heatmap"),
    ]

    def __init__(
        self,
        run: str,
        event: EventRecord,
        window: Mapping[str, tuple[list[int], list[float]]],
        started_ts: float | None,
        *,
        event_layers: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.event_layers = event_layers
        self.run = run
        self.event = event
        self._window = window
        self._started_ts = started_ts

    def content(self) -> ComposeResult:
        event = self.event
        kind = EVENT_KINDS.get(event.kind)
        at = "" if event.step is None else f" at step {event.step:,}"
        when = ""
        if self._started_ts is not None:
            when = f", {duration(event.first_ts - self._started_ts)} into the run"
        lines = [
            Content.assemble(
                severity(event.severity),
                ("  " + event.kind, "bold"),
                at,
                (f"  ×{event.count}" if event.count > 1 else "", "bold $warning"),
            ),
            Content.styled(event.message, "bold"),
            *([Content.styled(event.update_text(), "$warning")] if event.latest_message else []),
            Content.styled(f"run {self.run}, rank {event.rank}, id {event.id}{when}", "$foreground 60%"),
        ]
        if kind is not None:
            lines.append(Content.assemble(("what it means: ", "bold"), kind.summary))
        if event.details:
            lines += [Content(""), Content.styled("Details", "bold $primary"), *detail_lines(event.details)]
        if event.latest_details:
            lines += [Content(""), Content.styled("Since, at its latest repeat", "bold $primary"),
                      *detail_lines(event.latest_details)]
        if self.event_layers:
            more = len(self.event_layers) - 6
            shown = ", ".join(self.event_layers[:6]) + (f" and {more} more" if more > 0 else "")
            lines += [Content(""), Content.assemble(("Layers: ", "bold $primary"), shown,
                                                    ("   h: in the layer heatmap", "$foreground 60%"))]
        if event.step is not None:
            lines += [
                Content(""),
                Content.styled("Around this step", "bold $primary"),
                *context_table(self._window, event.step),
            ]
        yield Static(Content("\n").join(lines), id="event-detail")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return bool(self.event_layers) if action == "layers" else True

    def action_layers(self) -> None:
        self.dismiss("layers")
