"""What the dashboard needs from a source of messages, and what a replay adds.

A source fills its :class:`~tuimon.store.Store` on a thread of its own; the app only starts it,
stops it, names it, and, when it is a recording, steers it. Both are protocols (structural types):
:class:`~tuimon.sources.live.LiveSource` and :class:`~tuimon.sources.replay.ReplaySource` satisfy
them without inheriting, and mypy checks that they do wherever one is passed as the other (the
commands hand them to the app), so a missing method fails the type check, not a user.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tuimon.store import Store


class Source(Protocol):
    """A stream of messages into :attr:`store`, live or recorded."""

    @property
    def store(self) -> Store: ...

    def start(self) -> None:
        """Begin filling the store (on a thread of the source's own)."""

    def stop(self) -> None:
        """Stop and release sockets or files; idempotent."""

    def where(self) -> str:
        """Where the messages come from, in words (the status line)."""


@runtime_checkable
class ReplayControls(Protocol):
    """Steering a recorded source: pause, speed, seek. Safe to call from the UI thread."""

    def toggle_pause(self) -> None: ...

    def faster(self) -> None: ...

    def slower(self) -> None: ...

    def seek_relative(self, seconds: float) -> None:
        """Move by ``seconds`` of recorded time (negative: back)."""

    def seek_fraction(self, fraction: float) -> None:
        """Jump to a point of the recording, 0.0 its start, 1.0 its end."""


@runtime_checkable
class RankFocus(Protocol):
    """A source that can be told which rank's full stream to receive: a live source behind a
    relay receives every rank's summaries but only one rank's metrics per run
    (:meth:`~tuimon.sources.live.LiveSource.focus_rank`)."""

    def focus_rank(self, run: str, rank: int) -> None: ...
