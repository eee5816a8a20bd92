"""How a level looks in the job grid: a colour from the theme, and in the contrast theme a symbol.

Colours run from the theme's ``success`` through ``warning`` to ``error`` by how *bad* a level is
(a low utilisation is bad, a high temperature is), so the odd GPU out stands out whichever figure
is shown. The contrast theme's three are Okabe-Ito blue, yellow and orange, which colour-blind
readers tell apart, and it also draws each level as a block of its own height (▁ to █): the level
is read from the shape, the colour only repeats it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.color import Color

from tuimon.ui.job.metrics import LEVELS, GridMetric
from tuimon.ui.themes import SYMBOL_THEMES

#: The levels as block heights (symbol themes).
LEVEL_GLYPHS = "▁▂▃▄▅▆▇█"
#: A cell in the other themes: a solid block, its colour saying the level.
SOLID = "■"
#: A cell with no value for the figure shown (a rank without a GPU, a reading not yet sent).
NO_DATA = "·"
NO_DATA_STYLE = "$foreground 40%"


def ramp(theme_variables: Mapping[str, str], steps: int = LEVELS) -> tuple[str, ...]:
    """``steps`` colours (hex) from healthy to bad: success, warning, error blended in between."""
    stops = [Color.parse(theme_variables[name]) for name in ("success", "warning", "error")]
    colours = []
    for i in range(steps):
        position = 2 * i / (steps - 1)  # 0..2 across the two segments
        segment = min(int(position), 1)
        colours.append(stops[segment].blend(stops[segment + 1], position - segment).hex)
    return tuple(colours)


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
