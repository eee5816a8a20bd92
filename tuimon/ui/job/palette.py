"""How a level looks in the job grid: the shared level look (:mod:`tuimon.ui.levels`) per theme.

A cell is drawn as a solid block in most themes, as a block of its level's height in the symbol
themes (the contrast theme), its colour from the theme's ramp by how *bad* the level is for the
figure shown (a low utilisation is bad, a high temperature is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuimon.ui.job.metrics import GridMetric
from tuimon.ui.levels import LEVEL_GLYPHS, ramp
from tuimon.ui.themes import SYMBOL_THEMES

#: A cell in the other themes: a solid block, its colour saying the level.
SOLID = "■"


@dataclass(frozen=True)
class Palette:
    """The grid's look in one theme."""

    colours: tuple[str, ...]
    symbols: bool

    @classmethod
    def of_theme(cls, name: str, theme_variables: Mapping[str, str]) -> Palette:
        return cls(ramp(theme_variables), name in SYMBOL_THEMES)

    def glyph(self, level: int) -> str:
        return LEVEL_GLYPHS[level] if self.symbols else SOLID

    def style(self, metric: GridMetric, level: int) -> str:
        return self.colours[round(metric.badness(level) * (len(self.colours) - 1))]
