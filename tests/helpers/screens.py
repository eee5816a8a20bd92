"""What a screen's text widgets show, read as a user reads it."""

from __future__ import annotations

import io

from rich.console import Console
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static


def static_text(static: Static) -> str:
    """The plain text of one ``Static``: its string or ``Content``, else its Rich renderable
    (a table, as the help's sections are) printed without colour at a width that wraps nothing."""
    content = static.content
    if isinstance(content, (str, Content)):
        return str(content)
    console = Console(width=200, file=io.StringIO(), color_system=None)
    with console.capture() as captured:
        console.print(content)
    return captured.get()


def statics_text(screen: Screen[object]) -> str:
    """Every ``Static`` of ``screen``, one after the other (the help screen's keys and symbols)."""
    return "\n".join(static_text(static) for static in screen.query(Static))
