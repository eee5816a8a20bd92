"""Replay source: plays JSON Lines recordings into a :class:`~tuimon.store.Store`.

Several recordings (one per rank, or runs to compare) are merged by time while each keeps its own
line order, so a sender's ``seq`` never goes backwards. Playback follows a virtual clock that runs
at the recorded pace times the speed; the store is told to use that clock, so "stale" and
"elapsed" mean what they meant during the run. Seeking backwards rebuilds the store from the start
on the player's thread (the UI never waits for it); seeking forwards just plays ahead instantly.

Lines are kept as bytes and decoded again when played: a recording of a long run stays a few
hundred bytes a message in memory instead of a dict each.
"""

from __future__ import annotations

import bisect
import heapq
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

from publisher.wire.protocol import ProtocolError, decode
from publisher.wire.recorder import read_recording
from tuimon.errors import UserError
from tuimon.sink import Batch, Sink, SourceStatus
from tuimon.sources.base import ReplayControls, Source
from tuimon.sources.recording_files import resolve_recordings
from tuimon.store import Store

#: Playback speeds that +/- step through; ``math.inf`` plays as fast as possible.
SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, math.inf)
#: Messages applied per store update at most (bounds how long the store's lock is held).
_CHUNK = 5_000
#: Longest sleep of the player between checks for commands (pause, seek, speed, stop).
_TICK_S = 0.05


def speed_label(speed: float) -> str:
    return "max" if math.isinf(speed) else f"{speed:g}×"


def parse_speed(text: str) -> float:
    """``--speed`` values: one of :data:`SPEEDS` (``max`` for as fast as possible)."""
    value = math.inf if text.strip().lower() in ("max", "inf") else None
    if value is None:
        try:
            value = float(text.rstrip("xX×"))
        except ValueError:
            value = math.nan
    if value not in SPEEDS:
        choices = ", ".join(speed_label(s).rstrip("×") for s in SPEEDS)
        raise UserError(f"bad speed {text!r}: choose one of {choices}")
    return value


@dataclass
class Recording:
    """Merged frames of one or more recording files, in playing order."""

    lines: list[bytes] = field(default_factory=list)
    due: list[float] = field(default_factory=list)  # when each line plays: running max of ts
    malformed: list[tuple[ProtocolError, str]] = field(default_factory=list)  # (error, "file:line")
    names: list[str] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.due[0]

    @property
    def end(self) -> float:
        return self.due[-1]


def _read_file(path: Path, malformed: list[tuple[ProtocolError, str]]) -> list[tuple[float, bytes]]:
    frames = []
    try:
        for number, line, message in read_recording(path):
            if isinstance(message, ProtocolError):
                malformed.append((message, f"{path.name}:{number}"))
            else:
                frames.append((message["ts"], line))
    except OSError as exc:
        raise UserError(f"cannot read recording {path}: {exc.strerror or exc}") from None
    return frames


def load_recordings(targets: Sequence[str | Path]) -> Recording:
    """Read and validate recordings, each named as :mod:`tuimon.sources.recording_files` reads it;
    a target naming none, an unreadable file or no valid line is a UserError."""
    paths = resolve_recordings(targets)
    recording = Recording(names=[p.name for p in paths])
    per_file = [_read_file(Path(path), recording.malformed) for path in paths]
    merged = list(heapq.merge(*per_file, key=lambda frame: frame[0]))
    if not merged:
        detail = ""
        if recording.malformed:
            error, where = recording.malformed[0]
            detail = f" ({len(recording.malformed)} malformed lines, the first at {where}: {error})"
        raise UserError(f"no tuimon messages in {', '.join(map(str, paths))}{detail}")
    recording.lines = [line for _, line in merged]
    recording.due = list(accumulate((ts for ts, _ in merged), max))
    return recording


class ReplaySource:
    """Plays a :class:`Recording` into :attr:`store` on a background thread.

    Control methods (pause, speed, seek) may be called from any thread; they take effect within
    one player tick. ``tap``, when given, wraps the store in the sink the player fills (a baseline
    watch hears what the store is handed: :mod:`tuimon.compare.band`), while the app reads the
    store itself.
    """

    def __init__(
        self,
        paths: Sequence[str | Path],
        *,
        speed: float = 1.0,
        paused: bool = False,
        tap: Callable[[Store], Sink] | None = None,
    ) -> None:
        self.recording = load_recordings(paths)
        self.store = Store(clock=self.now, stamp_with_message_ts=True)
        self._sink: Sink = tap(self.store) if tap is not None else self.store
        self._control = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._speed = speed
        self._paused = paused
        self._anchor_virtual = self.recording.start
        self._anchor_wall = time.monotonic()
        self._seek_to: float | None = None
        self._index = 0  # lines[:_index] are in the store
        self._thread: threading.Thread | None = None
        self._count_bad_lines()
        self._publish_status()

    def where(self) -> str:
        """The recordings played, in words (status line)."""
        return ", ".join(self.recording.names)

    # ------------------------------------------------------------------------------ virtual clock

    def now(self) -> float:
        """The recording's time being shown (keeps running past the end, for "stale")."""
        with self._control:
            return self._virtual_now()

    def _virtual_now(self) -> float:
        if self._paused or math.isinf(self._speed):
            return self._anchor_virtual
        return self._anchor_virtual + (time.monotonic() - self._anchor_wall) * self._speed

    def _rebase(self, virtual: float) -> None:
        self._anchor_virtual, self._anchor_wall = virtual, time.monotonic()

    # ---------------------------------------------------------------------- control (any thread)

    @property
    def speed(self) -> float:
        return self._speed

    @property
    def paused(self) -> bool:
        return self._paused

    def set_speed(self, speed: float) -> None:
        with self._control:
            self._rebase(self._virtual_now())
            self._speed = speed
        self._wake.set()

    def faster(self) -> None:
        self.set_speed(SPEEDS[min(SPEEDS.index(self._speed) + 1, len(SPEEDS) - 1)])

    def slower(self) -> None:
        self.set_speed(SPEEDS[max(SPEEDS.index(self._speed) - 1, 0)])

    def set_paused(self, paused: bool) -> None:
        with self._control:
            self._rebase(self._virtual_now())
            self._paused = paused
        self._wake.set()

    def toggle_pause(self) -> None:
        self.set_paused(not self._paused)

    def seek_fraction(self, fraction: float) -> None:
        """Jump to a fraction of the recording (0 = first message, 1 = last)."""
        start, end = self.recording.start, self.recording.end
        self._seek(start + min(max(fraction, 0.0), 1.0) * (end - start))

    def seek_relative(self, seconds: float) -> None:
        """Jump ``seconds`` of recorded time forwards (positive) or backwards (negative)."""
        self._seek(self.now() + seconds)

    def _seek(self, virtual: float) -> None:
        virtual = min(max(virtual, self.recording.start), self.recording.end)
        with self._control:
            self._seek_to = virtual
            self._rebase(virtual)
        self._wake.set()

    # ------------------------------------------------------------------------------------ thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._play, name="tuimon-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _play(self) -> None:
        recording = self.recording
        while not self._stop.is_set():
            with self._control:
                seek_to, self._seek_to = self._seek_to, None
                fast = math.isinf(self._speed) and not self._paused
                target = self._virtual_now()
            if seek_to is not None:
                self._play_until(seek_to, rebuild=bisect.bisect_right(recording.due, seek_to) < self._index)
            elif fast and self._index < len(recording.lines):
                self._apply(self._index, min(self._index + _CHUNK, len(recording.lines)))
                with self._control:
                    if math.isinf(self._speed):
                        self._rebase(recording.due[self._index - 1])
                time.sleep(0)  # let the UI thread have the interpreter between chunks
            else:
                self._play_until(target, rebuild=False)
            self._publish_status()
            if not fast or self._index >= len(recording.lines):
                self._wait_for_next()

    def _play_until(self, virtual: float, *, rebuild: bool) -> None:
        if rebuild:
            self.store.reset()
            self._index = 0
            self._count_bad_lines()
        stop = bisect.bisect_right(self.recording.due, virtual)
        while self._index < stop:
            self._apply(self._index, min(self._index + _CHUNK, stop))

    def _apply(self, start: int, stop: int) -> None:
        # Lines were validated on loading, so decode() cannot fail here.
        self._sink.deliver(Batch([decode(line) for line in self.recording.lines[start:stop]]))
        self._index = stop

    def _wait_for_next(self) -> None:
        """Sleep until the next line is due, a command arrives, or one tick passes."""
        timeout = _TICK_S
        with self._control:
            if not self._paused and self._index < len(self.recording.due) and not math.isinf(self._speed):
                due_in = (self.recording.due[self._index] - self._virtual_now()) / self._speed
                timeout = min(max(due_in, 0.0), _TICK_S)
        self._wake.wait(timeout)
        self._wake.clear()

    def _count_bad_lines(self) -> None:
        if self.recording.malformed:
            self._sink.deliver(Batch((), malformed=self.recording.malformed))

    def _publish_status(self) -> None:
        recording = self.recording
        with self._control:
            virtual = self._virtual_now()
            speed, paused = self._speed, self._paused
        span = recording.end - recording.start
        shown = min(virtual, recording.end)
        if self._index >= len(recording.lines):
            position = 1.0
        else:
            position = (shown - recording.start) / span if span > 0 else 0.0
        self.store.tell(
            SourceStatus(
                kind="replay",
                detail=self.where(),
                speed=speed,
                paused=paused,
                position=position,
                position_ts=shown,
                duration_s=span,
            )
        )


if TYPE_CHECKING:  # mypy: a ReplaySource is a source the app can steer (a missing method fails here)
    _CONFORMS: tuple[type[Source], type[ReplayControls]] = (ReplaySource, ReplaySource)
