"""Dialogs: a box centred over the screen that opened it, never larger than the terminal.

Every modal of the UI (the help, an event's details, the incident dialogs) is one of these. Its
width is the one that suits its content on a large terminal (:attr:`Dialog.WIDTH`), capped at the
terminal's: a fixed 92-column help on an 80-column terminal lost its right border and cut every
line mid-word. Its height follows the content up to 90% of the terminal's, text wraps inside it,
and whatever still does not fit scrolls inside the box.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen

T = TypeVar("T")


class Dialog(ModalScreen[T]):
    """A centred, bordered, scrolling box holding :meth:`content`."""

    DEFAULT_CSS = """
    Dialog {
        align: center middle;
    }
    Dialog > .dialog-box {
        height: auto;
        max-width: 100%;
        max-height: 90%;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    """
    #: Columns of the box on a terminal wide enough for it (borders and padding included).
    WIDTH: ClassVar[int] = 92
    #: Whether the box itself takes the focus (to scroll with the keys); a dialog of fields gives
    #: it to its first field instead.
    BOX_FOCUSABLE: ClassVar[bool] = True

    def compose(self) -> ComposeResult:
        box = VerticalScroll(classes="dialog-box", can_focus=self.BOX_FOCUSABLE)
        box.styles.width = self.WIDTH
        with box:
            yield from self.content()

    def on_mount(self) -> None:
        # Textual scrolls the focused field into view before the box has its final height: on a
        # small terminal that hid the title, the keys and the field's own label above the top.
        box = self.query_one(".dialog-box", VerticalScroll)
        self.call_after_refresh(box.scroll_home, animate=False)

    def content(self) -> ComposeResult:
        """The widgets inside the box, top to bottom."""
        yield from ()
