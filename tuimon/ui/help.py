"""The `?` help screen: every key of the dashboard, generated from its bindings so it never goes
stale, plus what the panels and symbols mean.

Keys and symbols sit in two columns; a description too long for the terminal wraps inside its
own column, so the keys stay readable down the left at 80 columns as at 160. Each section is one
Rich table (``Table.grid``) in one widget: as a Textual grid of two widgets per entry (156 in
all) the help took 0.7-1 s to open on a two-core machine, styling and arranging each widget; as
tables about 0.5 s, half of it the dimmed dashboard behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from tuimon.ui.dialog import Dialog

#: A help section: its title and its (key or symbol, what it means) entries.
Section = tuple[str, list[tuple[str, str]]]


def binding_entries(
    bindings: Iterable[BindingType], display: Callable[[Binding], str]
) -> list[tuple[str, str]]:
    """``bindings`` as the help lists them: each key written as the footer writes it (``display``:
    the app's ``get_key_display``), then what it does in a sentence, else its footer label."""
    return [(display(binding), binding.tooltip or binding.description)
            for binding in bindings if isinstance(binding, Binding)]


_LEGEND: list[Section] = [
    ("Symbols", [
        ("✖ CRIT  ▲ WARN  ● info", "event severity (colour is only a second hint)"),
        ("✔ ok  ✖ VIOLATED  ○ unchecked", "invariant status (tab: read one whole)"),
        ("● LIVE  ◌ STALE  ■ ENDED", "connection state (STALE: no heartbeat for 3 s)"),
        ("◀ OUTLIER", "a GPU far from the others"),
        ("⚠ THROTTLE", "a GPU slowed down (reason shown)"),
        ("│ on the chart", "vertical lines mark the steps of events"),
    ]),
    ("Status line", [
        ("received", "messages read (live frames or recording lines)"),
        ("malformed", "skipped as not valid tuimon protocol, with the last reason (and line, in a replay)"),
        ("gaps", "messages lost on the way, from missing sequence numbers"),
        ("drops", "messages the publisher never sent: its queue was full (from heartbeats)"),
    ]),
]


class HelpScreen(Dialog[None]):
    """Lists ``sections`` of (key, description); any of escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen .help-title {
        text-style: bold;
        color: $primary;
        margin-bottom: 1;
    }
    HelpScreen .help-section {
        text-style: bold;
    }
    HelpScreen .help-entries {
        padding-left: 2;
        margin-bottom: 1;
    }
    """
    WIDTH = 100
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("q", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, sections: list[Section]) -> None:
        super().__init__()
        self._sections = sections

    def on_mount(self) -> None:
        super().on_mount()
        # A table's colours are fixed when it is built: a theme chosen from the command palette
        # while the help is open draws it anew.
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.refresh(recompose=True))

    def content(self) -> ComposeResult:
        yield Static("Keys of this screen  (escape, q or ? closes this list)", classes="help-title",
                     markup=False)
        # Keys in the theme's accent, as the footer shows them (a table cell takes no CSS class).
        key_style = Style(bold=True, color=self.app.theme_variables["accent"])
        yield from _entries(self._sections, key_style)
        yield from _entries(_LEGEND, key_style)


def _entries(sections: list[Section], key_style: Style) -> ComposeResult:
    """Each section's title, then its entries in two columns, the first as wide as the widest key
    (the same width for every section given together, so that their descriptions line up)."""
    widest = max((cell_len(key) for _, entries in sections for key, _ in entries), default=0)
    for title, entries in sections:
        yield Static(title, classes="help-section", markup=False)
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(width=widest, no_wrap=True, style=key_style)
        table.add_column(ratio=1)
        for key, description in entries:
            table.add_row(Text(key), Text(description))
        yield Static(table, classes="help-entries")
