"""The status line: what the source received, and what it had to skip or lost on the way."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from tuimon.store import Counters


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine {
        height: 1;
        background: $panel;
        color: $foreground 80%;
        padding: 0 1;
    }
    """

    def show(self, counters: Counters, where: str) -> None:
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
        parts.append(Content.styled(where, "$foreground 60%"))
        self.update(Content(" · ").join(parts))
