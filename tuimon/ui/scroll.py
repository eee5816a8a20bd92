"""Scrolling a cursor's view: the one rule every hand-drawn grid of the UI keeps (job, layers)."""

from __future__ import annotations


def keep_visible(row: int, top: int, shown: int, rows: int) -> int:
    """The first row to show so that ``row`` (the cursor's) is on screen, scrolling as little as
    possible: ``shown`` rows fit, of ``rows`` in all."""
    if row < top:
        top = row
    elif row >= top + shown:
        top = row - shown + 1
    return min(max(top, 0), max(rows - shown, 0))
