"""A screen's own commands in the command palette (ctrl+p), offered only while it is the screen
the palette opens over, as its keys are.

Textual asks the app for the commands every screen has (:meth:`App.get_system_commands`: quit,
themes) and each screen's ``COMMANDS`` providers for the rest. A screen that lists
:class:`ScreenCommands` there offers what its :meth:`OffersCommands.palette_commands` yields, read
when the palette opens (the metrics charted so far, whether there is a job view).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from textual.app import SystemCommand
from textual.command import DiscoveryHit, Hit, Hits, Provider


@runtime_checkable
class OffersCommands(Protocol):
    """A screen with commands of its own."""

    def palette_commands(self) -> Iterable[SystemCommand]:
        """The commands that make sense on the screen now."""
        ...


class ScreenCommands(Provider):
    """The palette's commands of the screen it was opened over (:class:`OffersCommands`)."""

    def _commands(self) -> list[SystemCommand]:
        screen = self.screen
        return list(screen.palette_commands()) if isinstance(screen, OffersCommands) else []

    async def discover(self) -> Hits:
        """Listed by title while nothing is typed, as Textual lists the app's."""
        for command in sorted(self._commands(), key=lambda command: command.title):
            if command.discover:
                yield DiscoveryHit(command.title, command.callback, help=command.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in self._commands():
            if (score := matcher.match(command.title)) > 0:
                yield Hit(score, matcher.highlight(command.title), command.callback, help=command.help)
