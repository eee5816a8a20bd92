"""The tuimon app: a source, the themes and the screens, wired together.

The dashboard (:mod:`tuimon.ui.dashboard.screen`) is the first screen and owns what it shows, its
keys and its timers; every other screen is opened from it. The app keeps only what is the same on
every screen: starting and stopping the source and the knowledge-base link, the themes, and the
keys of :mod:`tuimon.ui.keys` (quit, help, next theme) with the palette's theme commands.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, ClassVar

from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.screen import Screen

from tuimon.compare.band import Baseline
from tuimon.sources.base import ReplayControls, Source
from tuimon.store import Store
from tuimon.ui.dashboard.replay import ReplayDashboard
from tuimon.ui.dashboard.replay import key_section as replay_key_section
from tuimon.ui.dashboard.screen import DashboardScreen
from tuimon.ui.dashboard.screen import key_section as dashboard_key_section
from tuimon.ui.help import HelpScreen
from tuimon.ui.incidents.screen import key_sections as incident_key_sections
from tuimon.ui.job.screen import key_section as job_key_section
from tuimon.ui.keys import APP_KEYS
from tuimon.ui.layers.screen import key_section as layer_key_section
from tuimon.ui.services.kb_link import KbLink
from tuimon.ui.themes import DEFAULT_THEME, THEME_ORDER, load_themes


class TuimonApp(App[None]):
    """The dashboard over ``source``; ``run`` preselects a run; ``baseline`` is drawn beside its
    charts (``--baseline``). Commands start it through
    :func:`tuimon.ui.terminal.run_dashboard`, which also ends it when the terminal goes away."""

    TITLE = "tuimon"
    CSS = """
    /* Every screen's footer. A compact footer gives each key a right margin, the command palette's
       too: docked right, that key then stopped a column short of the edge, where the keys that
       overflow behind it showed one character ("^p palettee"). */
    Footer.-compact FooterKey.-command-palette {
        margin-right: 0;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = APP_KEYS

    def __init__(
        self,
        source: Source,
        *,
        theme: str = DEFAULT_THEME,
        run: str | None = None,
        kb_dir: str | None = None,
        baseline: Baseline | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self._wanted_run = run
        self._baseline = baseline
        for custom in load_themes().values():
            self.register_theme(custom)
        self._initial_theme = theme
        #: The incident knowledge base (``kb_dir``, else $TUIMON_KB, config, default), opened off
        #: the UI thread; "seen before" is offered for new events, the incident screen uses it.
        self.kb_link = KbLink(kb_dir)

    @property
    def store(self) -> Store:
        """What the source fills and every screen reads."""
        return self.source.store

    def get_default_screen(self) -> DashboardScreen:
        """The dashboard, with the replay's keys when the source is a recording."""
        dashboard: DashboardScreen
        if isinstance(self.source, ReplayControls):
            dashboard = ReplayDashboard(self.source, self.source, self.kb_link, run=self._wanted_run,
                                        baseline=self._baseline)
        else:
            dashboard = DashboardScreen(self.source, self.kb_link, run=self._wanted_run,
                                        baseline=self._baseline)
        self.dashboard = dashboard
        return dashboard

    def on_mount(self) -> None:
        self.theme = self._initial_theme
        self.source.start()
        self.kb_link.start(self)

    def on_unmount(self) -> None:
        self.source.stop()
        self.kb_link.stop()

    # ------------------------------------------------------------------------------- app-wide keys

    def action_help(self) -> None:
        """Every screen's keys (the incident screen's ``?`` lists its own instead)."""
        display = self.get_key_display
        self.push_screen(HelpScreen([
            dashboard_key_section(display), replay_key_section(display), layer_key_section(),
            job_key_section(display), *incident_key_sections(self),
        ]))

    def action_next_theme(self) -> None:
        order = list(THEME_ORDER)
        position = order.index(self.theme) if self.theme in order else -1
        self.theme = order[(position + 1) % len(order)]
        self.notify(f"theme: {self.theme}", timeout=2)

    def deliver_screenshot(
        self, filename: str | None = None, path: str | None = None, time_format: str | None = None
    ) -> str | None:
        """The palette's screenshot, saved in the working folder unless told otherwise: Textual's
        default, the user's Downloads folder, is rarely there on a training node reached over SSH,
        and the save then only says that it failed."""
        return super().deliver_screenshot(filename, path or os.getcwd(), time_format)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """Textual's, and a command per theme; a screen adds its own (:mod:`tuimon.ui.palette`)."""
        yield from super().get_system_commands(screen)
        for name in THEME_ORDER:
            yield SystemCommand(
                f"Theme: {name}", f"Switch to the {name} theme", lambda n=name: self._set_theme(n)
            )

    def _set_theme(self, name: str) -> None:
        self.theme = name
