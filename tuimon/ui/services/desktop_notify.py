"""Telling a dashboard in the background: a desktop notification or a bell, through the terminal.

Terminals report whether their window has the focus when asked to (DEC private mode 1004, which
Textual turns on and reports as ``AppFocus``/``AppBlur``, kept in ``App.app_focus``). While the
dashboard is in the foreground its event log says it all; in the background an alert (the
notifier's: live, at or above the level, once an episode, rate limited) is written to the terminal
as one of:

- ``osc9``: ``ESC ] 9 ; text BEL``, the notification of iTerm2's proprietary escape codes
  (https://iterm2.com/documentation-escape-codes.html), also shown by kitty and WezTerm;
- ``osc777``: ``ESC ] 777 ; notify ; title ; body BEL``, from urxvt's notify extension, also
  shown by foot (foot-ctlseqs(7)), kitty and WezTerm;
- ``bell``: BEL, which every terminal (and tmux) turns into a sound or an urgent window.

Terminals that know neither OSC ignore it. Event texts come from peers, so control characters are
replaced before they can end the sequence early and write to the terminal themselves.
"""

from __future__ import annotations

import re
from typing import Any

from textual.app import App

from tuimon.notify.alert import Alert
from tuimon.notify.notifier import Notifier
from tuimon.notify.targets import DeliveryError

#: Characters of a notification's text at most (notification daemons cut far shorter).
MAX_CHARS = 400
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def terminal_sequence(mode: str, alert: Alert) -> str:
    """What ``mode`` writes to the terminal for ``alert``."""
    if mode == "bell":
        return "\x07"
    title, text = _clean(alert.title), _clean(alert.text)
    if mode == "osc777":  # ';' separates the fields
        return f"\x1b]777;notify;{title.replace(';', ',')};{text.replace(';', ',')}\x07"
    return f"\x1b]9;{title}: {text}\x07"  # starts with "tuimon": never read as ConEmu's "9;N;" codes


class TerminalNotice:
    """A notifier target that writes to ``app``'s terminal while the app is in the background.

    The write happens on the app's thread (``call_from_thread``: Textual apps are not thread-safe),
    through the driver's ``write``, the way ``App.bell`` writes its BEL."""

    name = "the terminal"

    def __init__(self, app: App[Any], mode: str) -> None:
        self.app = app
        self.mode = mode

    def send(self, alert: Alert) -> None:
        try:
            self.app.call_from_thread(self._write, alert)
        except RuntimeError as exc:  # the app is not running (yet, or any more)
            raise DeliveryError(str(exc), retry=False) from None

    def _write(self, alert: Alert) -> None:
        driver = self.app._driver
        if not self.app.app_focus and driver is not None:
            driver.write(terminal_sequence(self.mode, alert))


def notify_in_background(app: App[Any], notifier: Notifier) -> None:
    """Add ``app``'s terminal to ``notifier``'s targets, as its settings' ``desktop`` mode says."""
    if notifier.settings.desktop != "off":
        notifier.add_target(TerminalNotice(app, notifier.settings.desktop))


def _clean(text: str) -> str:
    return _CONTROLS.sub(" ", text)[:MAX_CHARS]
