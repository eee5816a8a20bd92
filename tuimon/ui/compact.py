"""Small terminals: below a size, a screen shows one pane at a time instead of side by side.

The dashboard (one panel, picked on a tab bar) and the incident screen (the list, or the incident
it opens) switch the same way: the ``-compact`` class on the screen, set from the terminal's size
on every resize, with CSS keyed on it. One rule, so that a user learns one behaviour.
"""

from __future__ import annotations

from typing import Any

from textual.geometry import Size
from textual.screen import Screen

#: The class a screen carries while it shows one pane at a time.
COMPACT = "-compact"


def mark_compact(screen: Screen[Any], size: Size, wide: tuple[int, int]) -> bool:
    """Set ``screen``'s :data:`COMPACT` class for a terminal of ``size``: compact below ``wide``
    (columns, rows) in either direction. True when the class changed (the caller then redoes
    what CSS cannot: which pane shows, the keys the footer offers)."""
    compact = size.width < wide[0] or size.height < wide[1]
    if screen.has_class(COMPACT) == compact:
        return False
    screen.set_class(compact, COMPACT)
    return True
