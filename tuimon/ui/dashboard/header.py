"""The run header: which run, where, how far, how fast, and whether the data is live."""

from __future__ import annotations

import math

from textual.content import Content
from textual.widgets import Static

from publisher.wire.stall import WAITING
from tuimon.store import RunView, SourceStatus
from tuimon.ui.format import duration, number

_HEALTH = {
    "live": ("● LIVE", "$success"),
    "stale": ("◌ STALE", "$warning"),
    "ended": ("■ ENDED", "$secondary"),
}
_END_STYLE = {"completed": "$success", "interrupted": "$warning", "failed": "$error"}


def _ranks(ranks: tuple[int, ...], world_size: int | None) -> Content:
    """"rank 0" for one, "ranks 0-7" for several, and how many of the world that is when some are
    not heard: a bare "ranks 0" read as "no ranks"."""
    if not ranks:
        return Content.from_markup("ranks [b]—[/]")
    word, listed = ("rank", f"{ranks[0]}") if len(ranks) == 1 else ("ranks", f"{ranks[0]}-{ranks[-1]}")
    heard = f" ({len(ranks)} of {world_size} heard)" if world_size and world_size != len(ranks) else ""
    return Content.from_markup("$word [b]$listed[/]$heard", word=word, listed=listed, heard=heard)


def stalled(view: RunView) -> Content | None:
    """``⚠ stuck 12 s in fetch_batch (train.py:4)`` while a rank is stalled (the store's verdict,
    :mod:`publisher.wire.stall`; the rank the others wait for first, ``rank 1 ...`` in a run of
    several, with how many wait in a collective); None while none is."""
    verdict = view.stall
    if verdict is None:
        return None
    text = verdict.describe()
    if len(view.ranks) > 1:
        waiting = view.stall_waiting
        if verdict.state == WAITING and waiting > 1:
            text = f"{waiting} ranks {text}"
        else:
            text = f"rank {view.stall_rank} {text}" + (f", {waiting} waiting for it" if waiting else "")
    severity = verdict.severity()
    if severity in ("warning", "critical"):
        colour = "$error" if severity == "critical" else "$warning"
        return Content.styled(f" ⚠ {text} ", f"bold reverse {colour}")
    return Content.styled(f"… {text}", "bold $accent")


def replay_state(source: SourceStatus) -> Content | None:
    """``▶ REPLAY 4× 50% 0:15/0:30`` for a replay (its speed and position), None for a live source."""
    if source.kind != "replay":
        return None
    state = "❚❚ PAUSED" if source.paused else "▶ REPLAY"
    speed = "max" if source.speed is None or math.isinf(source.speed) else f"{source.speed:g}×"
    position = f"{source.position:.0%} {duration(source.position * source.duration_s)}"
    return Content.styled(f"{state} {speed} {position}/{duration(source.duration_s)}", "bold $accent")


def health(view: RunView, source: SourceStatus, now: float) -> Content:
    """LIVE / STALE / ENDED (a replay's runs are RUNNING at the point played, not live)."""
    label, style = _HEALTH[view.health]
    if source.kind == "replay" and view.health == "live":
        label = "● RUNNING"  # the run's state at this point of the recording, not a live link
    if view.health == "ended" and view.end_status:
        label = f"■ ENDED: {view.end_status}"
        style = _END_STYLE.get(view.end_status, style)
    elif view.health == "stale" and view.last_ts is not None and source.kind == "live":
        label = f"◌ STALE: silent {duration(now - view.last_ts)}"
    return Content.styled(label, f"bold {style}")


def _fitted(fields: list[tuple[int, Content]], separator: Content, width: int) -> Content:
    """The fields in their order, joined: the highest priorities first, each kept if the line still
    fits ``width`` with it (all of them while the width is not known yet)."""
    if width <= 0:
        return separator.join([field for _, field in fields])
    kept: set[int] = set()
    for index in sorted(range(len(fields)), key=lambda i: -fields[i][0]):
        trial = kept | {index}
        if separator.join([fields[i][1] for i in sorted(trial)]).cell_length <= width or not kept:
            kept = trial
    return separator.join([fields[i][1] for i in sorted(kept)])


class RunHeader(Static):
    """Two lines: the run's vital numbers, then notices (waiting, silent endpoints, ...)."""

    DEFAULT_CSS = """
    RunHeader {
        height: 2;
        background: $panel;
        padding: 0 1;
    }
    """

    def show(
        self,
        view: RunView | None,
        source: SourceStatus,
        notices: list[str],
        now: float,
        *,
        focus: int | None = None,
        width: int = 0,
    ) -> None:
        """``focus``: the rank picked in the job view, whose series the charts show; ``width``: the
        terminal's columns, which the first line fits (0: not known yet, nothing left out)."""
        separator = Content.styled(" │ ", "$foreground 40%")
        if view is None:
            first = Content.assemble(
                ("tuimon", "bold $primary"), separator, ("no run yet", "$foreground 70%")
            )
        else:
            end = now if view.health != "ended" or view.last_ts is None else view.last_ts
            elapsed = end - view.started_ts if view.started_ts is not None else None
            # (priority, field): where the line is too long, the lowest priority goes first.
            step = "—" if view.step is None else f"{view.step:,}"
            focused = Content.styled(f" ◎ rank {focus} ", "bold reverse $accent")
            replay = replay_state(source)
            fields: list[tuple[int, Content]] = [
                (9, Content.styled(view.name, "bold $primary")),
                (1, Content.from_markup("host [b]$host[/]", host=", ".join(view.hosts) or "—")),
                (4, _ranks(view.ranks, view.world_size)),
                *([(9, focused)] if focus is not None else []),
                (8, Content.from_markup("step [b]$step[/]", step=step)),
                *([(10, label)] if (label := stalled(view)) is not None else []),
            ]
            if replay is None:  # a replay's position says how far into the run it is
                fields.append((2, Content.from_markup("elapsed [b]$elapsed[/]", elapsed=duration(elapsed))))
            if view.throughput is not None:
                rate = view.throughput
                fields.append((3, Content.from_markup(
                    "[b]$value[/] $unit/s [dim]($span avg)[/]", value=number(rate.value, 3),
                    unit=rate.name.removesuffix("_per_s"), span=rate.span(),
                )))
            if view.telemetry_errors:  # parts of the Monitor that failed: their figures are missing
                failed = view.telemetry_errors
                parts = "part" if failed == 1 else "parts"
                fields.append((5, Content.styled(f"⚙ {failed} {parts} failed", "$warning")))
            if replay is not None:
                fields.append((6, replay))
            fields.append((8, health(view, source, now)))
            if view.gpu_simulated:
                fields.append((7, Content.styled(" SIMULATED GPUs ", "bold reverse $warning")))
            first = _fitted(fields, separator, width - 2)
        if notices:
            second = Content.styled("⚠ " + "  ⚠ ".join(notices), "$warning")
        elif view is not None and view.end_error:
            second = Content.styled(f"error: {view.end_error}", "$error")
        elif view is None and (replay := replay_state(source)) is not None:
            second = replay
        else:
            second = Content("")
        self.update(Content("\n").join([first, second]))
