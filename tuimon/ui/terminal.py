"""Running the dashboard in a real terminal: the commands' entry point, and leaving cleanly when the
terminal goes away (an SSH connection dropped mid-incident must not leave a demo's training or a
spinning process behind).
"""

from __future__ import annotations

import os
import signal
import sys
import termios
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from textual.app import App

from tuimon.compare.band import Baseline
from tuimon.notify.notifier import Notifier
from tuimon.sources.base import Source
from tuimon.ui.app import TuimonApp
from tuimon.ui.services.desktop_notify import notify_in_background
from tuimon.ui.themes import DEFAULT_THEME, check_theme_name, load_themes

#: Seconds the app gets to exit cleanly after its terminal went away, before the process is ended.
HANGUP_GRACE_S = 3.0


def run_dashboard(
    source: Source,
    theme: str | None,
    *,
    run: str | None = None,
    cleanup: Callable[[], None] | None = None,
    kb_dir: str | None = None,
    notifier: Notifier | None = None,
    baseline: Baseline | None = None,
) -> int:
    """Run the dashboard on ``source`` until the user quits or the terminal goes away (the
    commands' shared entry point). An unknown theme or a broken theme file is a UserError.
    ``cleanup`` runs if the process has to be ended hard (see :class:`TerminalWatch`); ``kb_dir``
    is ``--kb`` (the incident knowledge base; None: $TUIMON_KB, config, default). ``notifier``
    (the source's alerts) also tells the terminal while the dashboard is in the background.
    ``baseline`` (``--baseline``) is drawn beside the charts of the metrics it has."""
    chosen = check_theme_name(theme or DEFAULT_THEME, load_themes())
    app = TuimonApp(source, theme=chosen, run=run, kb_dir=kb_dir, baseline=baseline)
    if notifier is not None:
        notify_in_background(app, notifier)
    stdin = sys.__stdin__
    terminal = stdin.fileno() if stdin is not None and os.isatty(stdin.fileno()) else None
    with TerminalWatch(app, terminal, cleanup):
        app.run()
    return app.return_code or 0


class TerminalWatch:
    """Ends the dashboard when its terminal goes away (SSH dropped), whatever state the UI is in.

    Textual 8 alone: SIGHUP kills the process by the default action (no cleanup, a demo's training
    left running); when SIGHUP is ignored (nohup) or never sent (no controlling terminal), its
    input thread spins a core on the hung-up terminal; and its output thread dies on the first
    write error, after which the UI thread blocks for ever on the full output queue. So this watch
    runs on a thread of its own: on SIGHUP or SIGTERM, or when ``tcgetattr`` fails (every terminal
    ioctl fails after a hangup; checked every second), it asks the app to exit, and if the process
    is still there :data:`HANGUP_GRACE_S` later it runs ``cleanup`` and exits hard.
    """

    def __init__(self, app: App[None], terminal: int | None, cleanup: Callable[[], None] | None) -> None:
        self.app = app
        self.terminal = terminal
        self.cleanup = cleanup
        self._trigger = threading.Event()
        self._done = threading.Event()
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def __enter__(self) -> TerminalWatch:
        for signum in (signal.SIGHUP, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._signalled)
        threading.Thread(target=self._watch, name="tuimon-terminal-watch", daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        self._trigger.set()  # only this: the main thread may be stuck anywhere

    def _terminal_gone(self) -> bool:
        if self.terminal is None:
            return False
        try:
            termios.tcgetattr(self.terminal)
        except (termios.error, OSError):
            return True
        return False

    def _watch(self) -> None:
        while not self._trigger.wait(1.0):
            if self._done.is_set():
                return
            if self._terminal_gone():
                break
        if self._done.is_set():
            return
        self.app.exit()  # posts a message: safe from this thread
        if self._done.wait(HANGUP_GRACE_S):
            return
        if self.cleanup is not None:
            self.cleanup()
        os._exit(129)
