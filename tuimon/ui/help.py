"""The `?` help screen: every key of the dashboard, generated from its bindings so it never goes
stale, plus what the panels and symbols mean."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

_LEGEND = """\
[b]Symbols[/b]
  ✖ CRIT  ▲ WARN  ● info        event severity (colour is only a second hint)
  ✔ ok  ✖ VIOLATED  ○ unchecked   invariant status (tab: read one whole)
  ● LIVE  ◌ STALE (no heartbeat for 3 s)  ■ ENDED   connection state
  ◀ OUTLIER   a GPU far from the others;  ⚠ THROTTLE  a GPU slowed down (reason shown)
  vertical lines on the chart mark the steps of events

[b]Status line[/b]
  received    messages read (live frames or recording lines)
  malformed   skipped as not valid tuimon protocol, with the last reason (and line, in a replay)
  gaps        messages lost on the way, from missing sequence numbers
  drops       messages the publisher never sent: its queue was full (from heartbeats)
"""


class HelpScreen(ModalScreen[None]):
    """Lists ``bindings`` (key, description); any of escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 92;
        height: auto;
        max-height: 90%;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        super().__init__()
        self._sections = sections

    def compose(self) -> ComposeResult:
        lines = [Content.styled("tuimon keys", "bold $primary"), Content("")]
        for title, keys in self._sections:
            lines.append(Content.styled(title, "bold"))
            for key, description in keys:
                lines.append(Content.assemble(("  " + key.ljust(14), "bold $accent"), description))
            lines.append(Content(""))
        lines.append(Content.from_markup(_LEGEND))
        with VerticalScroll():
            yield Static(Content("\n").join(lines), id="help-text")
