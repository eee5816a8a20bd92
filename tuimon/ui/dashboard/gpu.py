"""The GPU panel: one card per device with utilisation, memory, temperature and power.

Each metric is a bar (where it is now) plus a fixed-scale history of the last few minutes. A
device far from its peers (a starving or throttled GPU drags the whole data-parallel job down to
its pace) is marked in words, not only in colour.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from publisher.wire.protocol import read_number
from tuimon.store import DeviceView, RunView
from tuimon.ui.format import bar, spark

#: A device this many utilisation points away from the median of the others is an outlier.
UTIL_OUTLIER_POINTS = 30.0
#: A device this much hotter than the median of the others is an outlier.
TEMP_OUTLIER_C = 15.0
_GIB = 1024**3
_BAR = 12
_SPARK = 24


def _value(device: Mapping[str, Any], key: str) -> float | None:
    """A device's reading as a float: finite, or the protocol's "nan"/"inf" markers read; None when
    the device does not report it."""
    value = device.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return read_number(value) if value in ("nan", "inf", "-inf") else None
    return float(value) if isinstance(value, int | float) else None


def find_outliers(devices: list[DeviceView]) -> dict[tuple[int, int], str]:
    """(rank, index) -> why the device stands out; needs three devices to have "the others"."""
    found: dict[tuple[int, int], str] = {}
    for key, threshold, unit in (("util", UTIL_OUTLIER_POINTS, "%"), ("temp_c", TEMP_OUTLIER_C, "°C")):
        readings = {(d.rank, d.index): v for d in devices if (v := _value(d.latest, key)) is not None}
        if len(readings) < 3:
            continue
        for device_key, value in readings.items():
            others = statistics.median(v for k, v in readings.items() if k != device_key)
            if abs(value - others) >= threshold and device_key not in found:
                label = "util" if key == "util" else "temp"
                found[device_key] = f"{label} {value:.0f}{unit} vs {others:.0f}{unit}"
    return found


def _fraction(used: float | None, total: float | None) -> float | None:
    return used / total if used is not None and total else None


def _line(
    label: str, fraction: float | None, value: str, history: list[float], low: float, high: float
) -> Content:
    return Content.assemble(
        (f"{label:<5} ", "$foreground 70%"),
        (bar(fraction, _BAR), "$primary"),
        f" {value:<15}",
        (spark(history, low, high, _SPARK), "$accent"),
    )


def _name(device: DeviceView) -> str:
    name = device.latest.get("name")
    return name if isinstance(name, str) else ""


def render_device(device: DeviceView, outlier: str | None, *, show_rank: bool, show_name: bool) -> Content:
    """The card's text: a title line with marks, then one line per metric."""
    return Content("\n").join([_title(device, outlier, show_rank, show_name), *_metric_lines(device)])


def _title(device: DeviceView, outlier: str | None, show_rank: bool, show_name: bool) -> Content:
    """Which GPU, its clock, and what is wrong with it (outlier, throttling, ECC errors)."""
    latest = device.latest
    who = f"r{device.rank} GPU {device.index}" if show_rank else f"GPU {device.index}"
    title = [Content.styled(who, "bold")]
    if show_name:
        title.append(Content.styled(f" {_name(device)}"[:24], "$foreground 70%"))
    clock = _value(latest, "sm_clock_mhz")
    if clock is not None:
        title.append(Content(f" {clock:.0f} MHz"))
    if outlier:
        title.append(Content(" "))
        title.append(Content.styled(f"◀ OUTLIER {outlier}", "bold reverse $warning"))
    throttle = latest.get("throttle")
    if isinstance(throttle, list) and throttle:
        title.append(Content.styled(f" ⚠ THROTTLE {', '.join(map(str, throttle))}", "bold $error"))
    ecc = latest.get("ecc_errors")
    if isinstance(ecc, int) and ecc > 0:
        title.append(Content.styled(f" ✖ ECC {ecc}", "bold $error"))
    return Content("").join(title)


def _metric_lines(device: DeviceView) -> list[Content]:
    """Utilisation, memory, temperature and power: bar, value, history."""
    latest, history = device.latest, device.history
    util = _value(latest, "util")
    used, total = _value(latest, "mem_used"), _value(latest, "mem_total")
    temp = _value(latest, "temp_c")
    power, limit = _value(latest, "power_w"), _value(latest, "power_limit_w")
    max_power = limit or max([p for p in history["power"] if math.isfinite(p)] or [1.0])
    memory = f"{used / _GIB:.1f}/{total / _GIB:.0f} GiB" if used is not None and total else "—"
    watts = "—" if power is None else (f"{power:.0f}/{limit:.0f} W" if limit else f"{power:.0f} W")
    return [
        _line("util", _fraction(util, 100.0), f"{util:.0f} %" if util is not None else "—",
              history["util"], 0.0, 100.0),
        _line("mem", _fraction(used, total), memory, history["mem"], 0.0, 100.0),
        _line("temp", _fraction(temp, 100.0), f"{temp:.0f} °C" if temp is not None else "—",
              history["temp"], 20.0, 100.0),
        _line("power", _fraction(power, max_power), watts, history["power"], 0.0, max_power),
    ]


class GpuCard(Static):
    DEFAULT_CSS = """
    GpuCard {
        height: auto;
        padding: 0 1;
        border-left: blank;
    }
    GpuCard.-outlier {
        border-left: thick $warning;
        background: $warning 12%;
    }
    GpuCard.-throttled {
        border-left: thick $error;
    }
    """


#: Cards shown at most: a node's GPUs (8 or 16) fit; a whole job's belong in a job view.
MAX_CARDS = 16
#: What the empty panel says while the run may still send GPU readings.
WAITING = "no GPU data yet"
#: What it says when the run said at its start that it reads no GPUs: none will come, and how
#: to get simulated ones (a demo on a machine without a GPU).
NO_GPUS = (
    "no GPUs on this run's host (gpu_source: none)\n"
    "for simulated ones (a demo): tuimon run --gpu simulated, or Monitor(gpu=\"simulated\")"
)


def empty_text(view: RunView | None) -> str:
    """What the panel says when it has no device to show."""
    return NO_GPUS if view is not None and view.gpu_source == "none" else WAITING


class GpuPanel(VerticalScroll):
    """Cards for every device of the selected run (all ranks)."""

    DEFAULT_CSS = """
    GpuPanel {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
        scrollbar-size-vertical: 1;
    }
    GpuPanel > .gpu-empty {
        color: $foreground 60%;
        padding: 1 2;
    }
    """

    def on_mount(self) -> None:
        self.border_title = "GPUs"
        self._placeholder: Static | None = None
        self._set_placeholder(WAITING)

    def _set_placeholder(self, text: str | None) -> None:
        """Show ``text`` in the empty panel (None: remove it, there are cards)."""
        if text is not None and self._placeholder is None:
            self._placeholder = Static(text, classes="gpu-empty", markup=False)
            self.mount(self._placeholder)
        elif text is not None and self._placeholder is not None:
            self._placeholder.update(text)
        elif text is None and self._placeholder is not None:
            self._placeholder.remove()
            self._placeholder = None

    def reset(self) -> None:
        """Another run (or a rebuilt store) is shown: the next :meth:`show` replaces the cards.

        Nothing is removed here: removal completes later, and a card still being removed would
        be found (and updated, then lost) by a :meth:`show` in the same tick.
        """
        self.border_subtitle = ""

    def show(self, devices: list[DeviceView], view: RunView | None) -> None:
        """Cards for the first :data:`MAX_CARDS` devices of the run of ``view``; the others are
        counted in the border, with how many of them stand out (outliers are found among all
        devices). Without devices, why there are none (:func:`empty_text`)."""
        self.border_title = "GPUs  SIMULATED" if view is not None and view.gpu_simulated else "GPUs"
        outliers = find_outliers(devices)
        hidden = devices[MAX_CARDS:]
        devices = devices[:MAX_CARDS]
        wanted = {f"gpu-{d.rank}-{d.index}" for d in devices}
        cards: dict[str, GpuCard] = {}
        for existing in self.query(GpuCard):
            if existing.id is not None and existing.id in wanted:
                cards[existing.id] = existing
            else:
                existing.remove()
        show_rank = len({d.rank for d in devices}) > 1
        names = {_name(d) for d in devices}
        show_name = len(names) > 1
        subtitle = f"{len(devices)} × {names.pop()}" if devices and not show_name else ""
        if hidden:
            flagged = sum((d.rank, d.index) in outliers or bool(d.latest.get("throttle")) for d in hidden)
            subtitle = f"{subtitle}  +{len(hidden)} more GPUs" + (f", {flagged} flagged" if flagged else "")
        self.border_subtitle = subtitle
        new_cards: list[GpuCard] = []
        for device in devices:
            card_id = f"gpu-{device.rank}-{device.index}"
            card = cards.get(card_id)
            if card is None:
                card = GpuCard(id=card_id)
                new_cards.append(card)
            key = (device.rank, device.index)
            card.update(render_device(device, outliers.get(key), show_rank=show_rank, show_name=show_name))
            card.set_class(key in outliers, "-outlier")
            card.set_class(bool(device.latest.get("throttle")), "-throttled")
        self._set_placeholder(None if devices else empty_text(view))
        if new_cards:
            self.mount_all(new_cards)
