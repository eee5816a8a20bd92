"""Text into the focused field the way a terminal pastes it: one event, not a key per character.

Textual's Pilot types a key at a time and waits twice for the app to go idle after each, about
0.1 s a key on a two-core machine, so a sentence typed in a test took seconds. A bracketed paste
(what a terminal sends when a user pastes) reaches the focused field as one ``Paste`` event,
through the same path a real terminal's paste takes (the app forwards it to the focused widget).
Tests that check typed letters reach a field, not the screen's key bindings, still type.
"""

from __future__ import annotations

from textual import events
from textual.pilot import Pilot


async def paste(pilot: Pilot, text: str) -> None:
    """``text`` into the focused field, then wait until the app has handled it."""
    pilot.app.post_message(events.Paste(text))
    await pilot.pause()
