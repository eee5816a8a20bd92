"""The user's config file, ``$XDG_CONFIG_HOME/tuimon/config.toml``: read in one place, errors in words.

Several commands take defaults from it (the knowledge-base folder, alerts, the shared git copy of
the knowledge base), so reading, parsing and type-checking live here once; each caller asks for the
key or section it owns. The format is TOML (`tomllib`, standard library since Python 3.11).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuimon.errors import UserError


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CONFIG_HOME/tuimon/config.toml``, else ``~/.config/tuimon/config.toml``."""
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "tuimon" / "config.toml"


def load_config(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The whole config file as a dict; empty when there is none. Unreadable or bad TOML: `UserError`."""
    path = config_path(env)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise UserError(f"cannot read the config file {path}: {reason}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None


def config_section(name: str, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The ``[name]`` table of the config file (empty when absent); anything but a table is an error."""
    value = load_config(env).get(name, {})
    if not isinstance(value, dict):
        raise UserError(f"{config_path(env)}: '{name}' must be a table ([{name}])")
    return value
