"""What alerts to send and where: the command line merged over the ``[notify]`` table, checked once.

Both ``tuimon watch`` and ``tuimon tail`` take the same settings (the options are defined once, in
:mod:`tuimon.commands._options`); every value is checked here, before anything is started, so a
typo in a URL or a command that does not exist is one line at start-up rather than a silent night
without alerts.
"""

from __future__ import annotations

import shlex
import shutil
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from publisher.wire.protocol import SEVERITIES
from tuimon.errors import UserError

#: Severities an alert can be asked for, lowest first (``info`` events never alert).
LEVELS = ("warning", "critical")
#: Each severity's rank, to compare an event's with the chosen level.
SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITIES)}
#: How the dashboard tells a terminal in the background (:mod:`tuimon.ui.services.desktop_notify`).
DESKTOP_MODES = ("osc9", "osc777", "bell", "off")
#: Alerts a minute at most, by default; beyond it they are counted and summed up in one alert.
DEFAULT_PER_MINUTE = 10
#: The keys a ``[notify]`` table may hold.
CONFIG_KEYS = ("cmd", "url", "level", "per_minute", "desktop")


@dataclass(frozen=True)
class NotifySettings:
    """Checked settings: ``command`` as an argument list (never a shell), ``url`` an http(s) URL."""

    command: tuple[str, ...] | None = None
    url: str | None = None
    level: str = "warning"
    per_minute: int = DEFAULT_PER_MINUTE
    desktop: str = "osc9"

    @property
    def external(self) -> bool:
        """Whether anything outside the terminal is to be told (a command or a webhook)."""
        return self.command is not None or self.url is not None


def resolve(options: Mapping[str, Any], config: Mapping[str, Any], where: str) -> NotifySettings:
    """``options`` (command-line values by config key, None where not given) over ``config`` (the
    ``[notify]`` table of the file ``where``); a `UserError` names the bad value and its source."""
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} in [notify] (known: {', '.join(CONFIG_KEYS)})")
    chosen: dict[str, tuple[Any, str]] = {}
    for key in CONFIG_KEYS:
        if options.get(key) is not None:
            chosen[key] = (options[key], f"--notify-{key.replace('_', '-')}")
        elif key in config:
            chosen[key] = (config[key], f"{key} in [notify] of {where}")
    defaults = NotifySettings()
    return NotifySettings(
        command=_command(*chosen["cmd"]) if "cmd" in chosen else None,
        url=_url(*chosen["url"]) if "url" in chosen else None,
        level=_choice(*chosen["level"], LEVELS) if "level" in chosen else defaults.level,
        per_minute=_positive(*chosen["per_minute"]) if "per_minute" in chosen else defaults.per_minute,
        desktop=_choice(*chosen["desktop"], DESKTOP_MODES) if "desktop" in chosen else defaults.desktop,
    )


def _command(value: Any, source: str) -> tuple[str, ...]:
    """A command line split as a POSIX shell would (``shlex.split``) but run without one: no
    globbing, pipes or variables, so an event's text can never become shell syntax."""
    if not isinstance(value, str):
        raise UserError(f"{source}: expected a command line (a string)")
    try:
        argv = tuple(shlex.split(value))
    except ValueError as exc:
        raise UserError(f"{source}: cannot split {value!r} ({exc})") from None
    if not argv:
        raise UserError(f"{source}: the command is empty")
    if shutil.which(argv[0]) is None:
        raise UserError(f"{source}: command not found: {argv[0]}")
    return argv


def _url(value: Any, source: str) -> str:
    parsed = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"{source}: expected an http:// or https:// URL, got {value!r}")
    return str(value)


def _choice(value: Any, source: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UserError(f"{source}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _positive(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{source}: expected a whole number of alerts a minute (1 or more), got {value!r}")
    return value
