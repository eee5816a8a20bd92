"""The dashboard over a recording: the same screen, plus the keys that steer the replay.

Pause, speed and seek mean something only for a recording, so they are bindings of this screen
alone: a live dashboard neither shows nor takes them. The header shows what they changed (paused,
speed, position) as it shows any figure, from the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from textual.app import SystemCommand
from textual.binding import Binding, BindingType

from tuimon.compare.band import Baseline
from tuimon.sources.base import ReplayControls, Source
from tuimon.ui.dashboard.screen import DashboardScreen
from tuimon.ui.help import Section, binding_entries
from tuimon.ui.services.kb_link import KbLink


class ReplayDashboard(DashboardScreen):
    """The dashboard over ``source``, a recording that ``replay`` steers (the same object, seen as
    each protocol)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "toggle_pause", "Pause", tooltip="Pause or resume the replay"),
        Binding("plus", "faster", "Faster", key_display="+", tooltip="Replay faster (up to 64x, then max)"),
        Binding("minus", "slower", "Slower", key_display="-", tooltip="Replay slower (down to 0.5x)"),
        Binding("left", "seek(-10)", "-10s", tooltip="Back 10 s of recorded time"),
        Binding("right", "seek(10)", "+10s", tooltip="Forward 10 s of recorded time"),
        Binding("home", "seek_to(0)", "Start", tooltip="Go to the start of the recording"),
        Binding("end", "seek_to(1)", "End", tooltip="Go to the end of the recording"),
    ]

    def __init__(
        self, source: Source, replay: ReplayControls, kb_link: KbLink, *, run: str | None = None,
        baseline: Baseline | None = None,
    ) -> None:
        super().__init__(source, kb_link, run=run, baseline=baseline)
        self.replay = replay

    def action_toggle_pause(self) -> None:
        self.replay.toggle_pause()

    def action_faster(self) -> None:
        self.replay.faster()

    def action_slower(self) -> None:
        self.replay.slower()

    def action_seek(self, seconds: float) -> None:
        self.replay.seek_relative(float(seconds))

    def action_seek_to(self, fraction: float) -> None:
        self.replay.seek_fraction(float(fraction))

    def palette_commands(self) -> Iterable[SystemCommand]:
        yield from super().palette_commands()
        yield SystemCommand("Replay: pause / resume", "Pause or resume the replay", self.action_toggle_pause)
        yield SystemCommand("Replay: faster", "Double the replay speed", self.action_faster)
        yield SystemCommand("Replay: slower", "Halve the replay speed", self.action_slower)
        yield SystemCommand("Replay: go to start", "Seek to the beginning", lambda: self.action_seek_to(0))
        yield SystemCommand("Replay: go to end", "Seek to the end", lambda: self.action_seek_to(1))


def key_section(display: Callable[[Binding], str]) -> Section:
    """The replay's keys, as the help screen lists them (``display``: how the app writes a key)."""
    return "Replay only", binding_entries(ReplayDashboard.BINDINGS, display)
