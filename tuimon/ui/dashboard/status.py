"""The status line: what the source received, and what it had to skip or lost on the way."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from tuimon.store import Counters


class StatusLine(Static):
    """One line; where the source's name does not fit, its start is cut, never its end."""

    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $foreground 80%;
        padding: 0 1;
    }
    """

    def show(self, counters: Counters, where: str, width: int = 0) -> None:
        """``width``: the terminal's columns (0: not known yet, nothing cut)."""
        parts = [Content.from_markup("received [b]$n[/]", n=f"{counters.received:,}")]
        if counters.malformed:
            reasons = ", ".join(f"{count} {reason}" for reason, count in counters.malformed_by_reason.items())
            parts.append(Content.styled(f"✖ malformed {counters.malformed:,} ({reasons})", "bold $error"))
            if counters.last_malformed:
                parts.append(Content(f"last: {counters.last_malformed}"[:90]))
        else:
            parts.append(Content("malformed 0"))
        parts.append(Content.styled(f"gaps {counters.gaps:,}", "bold $warning" if counters.gaps else ""))
        parts.append(
            Content.styled(
                f"publisher drops {counters.dropped:,}", "bold $warning" if counters.dropped else ""
            )
        )
        separator = Content(" · ")
        room = width - 2 - separator.join(parts).cell_length - separator.cell_length
        if 0 < room < len(where):  # the end of a path names the file: the start goes
            where = "…" + where[-(room - 1):] if room > 1 else "…"
        parts.append(Content.styled(where, "$foreground 60%"))
        self.update(separator.join(parts))
