"""How a level of "bad" looks, for every heatmap of the UI (the job grid, the layer heatmap).

Colours run from the theme's ``success`` through ``warning`` to ``error``, so the odd cell out
stands out whatever the figure. The contrast theme's three are Okabe-Ito blue, yellow and orange,
which colour-blind readers tell apart, and it also draws each level as a block of its own height
(▁ to █): the level is read from the shape, the colour only repeats it.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.color import Color

#: The levels as block heights (symbol themes); their number is the number of levels.
LEVEL_GLYPHS = "▁▂▃▄▅▆▇█"
LEVELS = len(LEVEL_GLYPHS)
#: A cell with no value for the figure shown (a rank without a GPU, a layer not in that sample).
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
