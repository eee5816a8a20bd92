"""Small text builders shared by the panels: bars, numbers, durations, severity labels.

States are always spelled out with a symbol and a word besides their colour, so the high-contrast
theme and colour-blind readers never depend on red against green.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from textual.content import Content

#: severity -> (label with symbol, style)
SEVERITY_STYLE = {
    "critical": ("✖ CRIT", "bold $error"),
    "warning": ("▲ WARN", "bold $warning"),
    "info": ("● info", "bold $primary"),
}
_BLOCKS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar in eighth-cell steps; an unknown value is a dotted track."""
    if fraction is None or math.isnan(fraction):
        return "·" * width
    cells = min(max(fraction, 0.0), 1.0) * width
    full = int(cells)
    eighths = int((cells - full) * 8)
    partial = _BLOCKS[eighths] if eighths and full < width else ""
    return ("█" * full + partial).ljust(width, "░")[:width]


def number(value: float | None, digits: int = 4) -> str:
    """A compact human number: 0.0123, 1.23e-05, 12.3k, nan."""
    if value is None:
        return "—"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.{digits - 1}g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.{digits - 1}g}k"
    if magnitude >= 1e3:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def duration(seconds: float | None) -> str:
    """h:mm:ss (or m:ss under an hour); "—" when unknown or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def labelled(key: str, labels: Mapping[str, tuple[str, str]], fallback_style: str = "") -> Content:
    """A state as its label (symbol and word) in its style, from a ``key -> (label, style)`` table;
    an unknown state shows as its own name, so nothing a peer sends is hidden."""
    label, style = labels.get(key, (key, fallback_style))
    return Content.styled(label, style)


def severity(name: str) -> Content:
    return labelled(name, SEVERITY_STYLE, "bold $foreground")


_SPARKS = "▁▂▃▄▅▆▇█"


def spark(values: list[float], low: float, high: float, width: int) -> str:
    """A one-line history on a FIXED scale (Textual's Sparkline rescales to its data's own min
    and max, which makes a steady 97-99 % utilisation look like wild swings). The newest samples
    fill the right end; older ones are bucketed by their maximum so a short spike stays visible."""
    values = [v for v in values if math.isfinite(v)]
    if not values or width <= 0 or not (math.isfinite(low) and math.isfinite(high)):
        return " " * max(width, 0)
    per_cell = max(1, math.ceil(len(values) / width))
    ends = range(len(values), 0, -per_cell)
    cells = [max(values[max(0, end - per_cell) : end]) for end in ends][::-1]
    span = (high - low) or 1.0
    text = "".join(_SPARKS[min(max(int((v - low) / span * 7.999), 0), 7)] for v in cells)
    return text.rjust(width)
