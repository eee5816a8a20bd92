"""What a viewer subscribes to: everything from publishers, a bounded stream from a relay.

Connected to publishers, a viewer takes every message. Connected to a relay (it knows from the
relay's beat), it would otherwise receive every rank's per-step metrics, which at thousands of
ranks is tens of thousands of messages a second nobody looks at. So it switches to the job's
topics (:mod:`publisher.wire.topics`): everything but per-step ``metrics``, per-rank ``gpu``
readings and heartbeats, which node summaries carry (each rank's latest figures, GPUs, and how
long ago it was heard), plus the full stream of one *focused* rank per run (rank 0 until the
user drills into another). Leaving heartbeats to the summaries matters at the root: they were
four fifths of what a job of 8-GPU nodes sent up the tree. ZeroMQ carries each subscription up
the relays to the one publisher concerned, so the filtering happens at the source.
"""

from __future__ import annotations

import threading

from publisher.wire.topics import EVERYTHING, subscription

#: Types a job viewer receives from every rank.
JOB_TYPES = ("run_start", "run_end", "event", "invariant", "relay", "summary")
#: Types it receives from the focused rank of each run only.
FOCUS_TYPES = ("metrics", "gpu", "heartbeat")


class Subscriptions:
    """The topics of a receiver's SUB socket. :meth:`focus` may be called from any thread; the
    receiver's thread calls :meth:`heard` for each message and applies :meth:`topics` when it
    changed."""

    def __init__(self, *, follow_relays: bool = True) -> None:
        """``follow_relays`` False keeps every message even from a relay (``tuimon tail --all``)."""
        self.follow_relays = follow_relays
        self.job = False
        self._focus: dict[str, int] = {}
        self._lock = threading.Lock()
        self._changed = False

    def focus(self, run: str, rank: int) -> None:
        """Receive ``rank``'s full stream for ``run`` (instead of the previous focused rank's)."""
        with self._lock:
            if self._focus.get(run) != rank:
                self._focus[run] = rank
                self._changed = True

    def focused(self, run: str, rank: int) -> bool:
        with self._lock:
            return self._focus.get(run, 0) == rank

    def heard(self, msg_type: str, run: str) -> None:
        """A message arrived: a relay's beat turns job mode on; a new run gets rank 0 in focus
        (from its first message, so that the switch to job topics keeps every known run's focused
        stream without a moment unsubscribed)."""
        if msg_type == "relay":
            if self.follow_relays and not self.job:
                with self._lock:
                    self.job = self._changed = True
        elif run not in self._focus:
            self.focus(run, 0)

    def take_change(self) -> set[bytes] | None:
        """The topics to hold now, if they changed since the last call."""
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            if not self.job:
                return {EVERYTHING}
            topics = {subscription(msg_type) for msg_type in JOB_TYPES}
            topics |= {subscription(msg_type, run, rank) for run, rank in self._focus.items()
                       for msg_type in FOCUS_TYPES}
            return topics
