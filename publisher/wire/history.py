"""What a viewer that joins mid-run needs to draw the same screen as one that watched from the start.

PUB/SUB delivers only what is sent after a subscriber connects (ZeroMQ's slow-joiner problem), so
the publisher keeps this bounded history and serves it on request (the "clone" pattern, see
``docs/protocol.md``). The encoded frames are stored, not the dicts: serving a snapshot re-encodes
nothing and the snapshot is byte for byte what the live stream carried.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

_Stored = tuple[int, bytes]  # (seq, frame)


class SnapshotHistory:
    """Bounded state of a run: the start, recent metrics, every event episode, latest statuses.

    Used by one thread (the publisher's sender thread); not locked.
    """

    def __init__(self, max_metrics: int = 10_000, max_events: int = 10_000) -> None:
        self._max_events = max_events
        self._metrics: deque[_Stored] = deque(maxlen=max_metrics)
        # Keyed by event id; insertion order is update order, so the first key is the episode
        # that has gone longest without news and is the one evicted past max_events.
        self._events: dict[str | tuple[int], _Stored] = {}
        self._invariants: dict[str, _Stored] = {}
        self._singles: dict[str, _Stored] = {}  # run_start, the latest gpu, run_end
        self._last_seq = -1

    @property
    def last_seq(self) -> int:
        """The seq of the last message added (kept or not): the snapshot is complete up to it."""
        return self._last_seq

    def add(self, message: Mapping[str, Any], frame: bytes) -> None:
        """Record one sent message; ``frame`` is its encoding. Heartbeats only advance last_seq."""
        seq = message["seq"]
        self._last_seq = seq
        kind = message["type"]
        if kind == "metrics":
            self._metrics.append((seq, frame))
        elif kind == "event":
            self._add_event(message, (seq, frame))
        elif kind == "invariant":
            name = message.get("name")
            if isinstance(name, str):
                self._invariants[name] = (seq, frame)
        elif kind in ("run_start", "gpu", "run_end"):
            self._singles[kind] = (seq, frame)

    def _add_event(self, message: Mapping[str, Any], stored: _Stored) -> None:
        """An update of an episode (same id, higher count) replaces the older frame of that id."""
        event_id = message.get("id")
        key = event_id if isinstance(event_id, str) else (stored[0],)  # no id: its own episode
        self._events.pop(key, None)
        self._events[key] = stored
        if len(self._events) > self._max_events:
            del self._events[next(iter(self._events))]

    def event_frames(self) -> list[bytes]:
        """The latest update of every episode kept, oldest news first."""
        return [frame for _, frame in self._events.values()]

    def frames(self) -> list[bytes]:
        """Every kept frame in seq order, ready to send after the snapshot header."""
        kept = [
            *self._singles.values(),
            *self._metrics,
            *self._events.values(),
            *self._invariants.values(),
        ]
        kept.sort(key=lambda stored: stored[0])
        return [frame for _, frame in kept]
