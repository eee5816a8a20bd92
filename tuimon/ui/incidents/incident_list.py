"""The incident list: incidents (most recently active first) or search hits (best first, with a
highlighted snippet of where each matched).

Rebuilt only when what it shows changed (the screen reloads on every change to the knowledge
base, most of which do not touch the list), and the highlight stays on the same incident.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.content import Content
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tuimon.kb import Incident, SearchHit
from tuimon.ui.incidents.format import hit_row, incident_row


class IncidentList(OptionList):
    DEFAULT_CSS = """
    IncidentList {
        height: 1fr;
        max-height: 100%;
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        padding: 0;
    }
    IncidentList:focus {
        border: round $accent;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[object, ...] | None = None
        #: Shown (dimmed) when there is nothing to list.
        self.empty_text = "no incidents"

    @property
    def selected_number(self) -> int | None:
        """The number of the highlighted incident, if any."""
        option = self.highlighted_option
        return int(option.id) if option is not None and option.id is not None else None

    def show_incidents(self, incidents: Sequence[Incident], keep: int | None = None) -> None:
        self._show(
            tuple(incidents), [incident_row(i) for i in incidents], [i.number for i in incidents], keep
        )

    def show_hits(self, hits: Sequence[SearchHit], keep: int | None = None) -> None:
        self._show(tuple(hits), [hit_row(h) for h in hits], [h.incident.number for h in hits], keep)

    def _show(self, shown: tuple[object, ...], rows: list, numbers: list[int], keep: int | None) -> None:
        """Replace the options if they changed; highlight ``keep`` (else the same incident as
        before, else the first)."""
        wanted = keep if keep is not None else self.selected_number
        if shown != self._shown or not shown:
            self._shown = shown
            options = [Option(row, id=str(number)) for row, number in zip(rows, numbers, strict=True)]
            self.set_options(options or [Option(Content.styled(self.empty_text, "italic"), disabled=True)])
        if not numbers:
            return
        index = numbers.index(wanted) if wanted in numbers else 0
        if self.highlighted != index:
            self.highlighted = index
