"""Every screen's footer: the screen's keys in the order it lists them, as many as fit whole.

Textual's footer lays every key out in one row and the terminal cuts the row where it ends: at 80
columns the dashboard's read ``c Chart e Ev▏``, hiding the keys to the incidents. Here each screen
lists its keys most useful first, the footer shows those that fit whole, and when some are left out
the help key (always among the first, and listing them all) reads ``? More``.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.events import Resize
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

#: Columns a compact footer gives a key besides its key and description: the space between them
#: and the key's right margin (tuimon.ui.app's CSS).
_KEY_EXTRA = 2
#: The help key's description when keys are left out: the help lists them all.
_MORE = "More"


def _width(key: FooterKey) -> int:
    return len(key.key_display) + len(key.description) + _KEY_EXTRA


class FittedFooter(Footer):
    """A compact footer that never cuts a key in two (see the module's docstring). The command
    palette's key (docked right) is the first to go: the help names it too."""

    def __init__(self) -> None:
        super().__init__(compact=True)
        self._fitted_to = 0

    def compose(self) -> ComposeResult:
        keys = [widget for widget in super().compose() if isinstance(widget, FooterKey)]
        listed = [key for key in keys if not key.has_class("-command-palette")]
        room = self.app.size.width
        shown: list[FooterKey] = []
        for key in listed:
            if sum(map(_width, shown)) + _width(key) > room:
                break
            shown.append(key)
        if len(shown) < len(listed):
            for key in shown:
                if key.action.endswith("help"):
                    key.description = _MORE
        else:
            palette = [key for key in keys if key not in listed]
            shown += [key for key in palette if sum(map(_width, shown)) + _width(key) - 1 <= room]
        self.styles.grid_size_columns = len(shown)
        yield from shown

    def on_resize(self, event: Resize) -> None:
        if event.size.width != self._fitted_to:
            self._fitted_to = event.size.width
            self.call_after_refresh(self.recompose)
