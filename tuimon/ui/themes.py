"""Theme files (TOML) turned into Textual themes.

A theme file holds the fields of :class:`textual.theme.Theme` (``name``, ``primary``, ...) and an
optional ``[variables]`` table of Textual design variables. Files live in ``themes/`` in the
repository and ship in the wheel as ``tuimon/_data/themes``. A broken file is reported with its
path and the problem, never as a traceback from deep inside Textual.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from textual.color import Color, ColorParseError
from textual.theme import BUILTIN_THEMES, Theme

import tuimon
from tuimon.errors import UserError

DEFAULT_THEME = "tuimon-dark"
#: Our themes in the order the theme key cycles through them.
THEME_ORDER = ("tuimon-dark", "tuimon-light", "tuimon-contrast")
#: Themes that say every level with a symbol as well as a colour (the job grid's cells as block
#: heights rather than solid blocks): nothing in them is carried by colour alone.
SYMBOL_THEMES = frozenset({"tuimon-contrast"})

_COLOR_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(_COLOR_FIELDS, str),
    "name": str,
    "dark": bool,
    "luminosity_spread": (int, float),
    "text_alpha": (int, float),
    "variables": dict,
}


def themes_dir() -> Path:
    """The installed themes (wheel), else the repository's ``themes/`` (editable install)."""
    package = Path(tuimon.__file__).parent
    installed = package / "_data" / "themes"
    return installed if installed.is_dir() else package.parent / "themes"


def load_theme(path: Path) -> Theme:
    """One theme file; raises :class:`UserError` naming the file and what is wrong with it."""

    def broken(problem: str) -> UserError:
        return UserError(f"theme file {path}: {problem}")

    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise broken(f"cannot read it ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise broken(f"not valid TOML: {exc}") from None
    for key, value in data.items():
        expected = _FIELD_TYPES.get(key)
        if expected is None:
            known = ", ".join(sorted(_FIELD_TYPES))
            raise broken(f"unknown key {key!r} (known keys: {known})")
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise broken(f"{key!r} has the wrong type ({type(value).__name__})")
    for required in ("name", "primary"):
        if required not in data:
            raise broken(f"missing {required!r}")
    variables = data.get("variables", {})
    for key, value in variables.items():
        if not isinstance(value, str):
            raise broken(f"variable {key!r} must be a string")
    colors = {key: data[key] for key in _COLOR_FIELDS if key in data}
    colors.update({f"variables.{key}": value for key, value in variables.items() if value.startswith("#")})
    for key, value in colors.items():
        try:
            Color.parse(value)
        except ColorParseError as exc:
            raise broken(f"{key!r}: {exc}") from None
    known_fields = {f.name for f in dataclasses.fields(Theme)}
    return Theme(**{key: value for key, value in data.items() if key in known_fields})


def load_themes(directory: Path | None = None) -> dict[str, Theme]:
    """Every ``*.toml`` theme in ``directory`` (default :func:`themes_dir`), by theme name."""
    directory = themes_dir() if directory is None else directory
    themes: dict[str, Theme] = {}
    for path in sorted(directory.glob("*.toml")):
        theme = load_theme(path)
        if theme.name in themes:
            raise UserError(f"theme file {path}: theme name {theme.name!r} is used by another file")
        themes[theme.name] = theme
    if not themes:
        raise UserError(f"no theme files (*.toml) in {directory}; reinstall tuimon")
    return themes


def check_theme_name(name: str, themes: dict[str, Theme]) -> str:
    """``--theme`` values: our themes or Textual's built-in ones."""
    if name in themes or name in BUILTIN_THEMES:
        return name
    choices = ", ".join([*themes, *sorted(BUILTIN_THEMES)])
    raise UserError(f"unknown theme {name!r}; choose one of {choices}")
