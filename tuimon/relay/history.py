"""What a relay keeps for viewers that join late: the job's state, not its every step.

A viewer that connects to a relay mid-run has missed each rank's ``run_start`` (the config, the
command line), the events so far (a straggler named an hour ago), the invariants' statuses and the
nodes' summaries. Ranks' own snapshot sockets are on their own nodes, usually out of reach, so the
relay answers for its subtree, ZeroMQ's clone pattern one level up (the zguide, chapter 5): the
latest frame of each of those, byte for byte as it passed, bounded whatever the job's size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

#: Message types a relay keeps (the latest of each key).
KEPT_TYPES = ("run_start", "event", "invariant", "summary", "run_end")
#: Frames kept in all: at most this many; the oldest go first (run starts are kept longest).
MAX_FRAMES = 100_000


class JobHistory:
    """The latest frame per (type, run, rank or node or id, name): run starts, events, invariants,
    node summaries and run ends, in the order a viewer should apply them."""

    def __init__(self, max_frames: int = MAX_FRAMES) -> None:
        self.max_frames = max_frames
        self._starts: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self._rest: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()

    def keep(self, frame: bytes, message: Mapping[str, Any]) -> None:
        msg_type, run = message["type"], message["run"]
        key: tuple[Any, ...]
        if msg_type == "run_start":
            book, key = self._starts, (run, message["rank"])
        elif msg_type == "event":
            book, key = self._rest, ("event", run, message.get("id") or (message["rank"], message["seq"]))
        elif msg_type == "invariant":
            book, key = self._rest, ("invariant", run, message["rank"], message["name"])
        elif msg_type == "summary":
            book, key = self._rest, ("summary", run, message["node"])
        elif msg_type == "run_end":
            book, key = self._rest, ("run_end", run, message["rank"])
        else:
            return
        book.pop(key, None)  # an update moves to the end: the oldest are dropped first
        book[key] = frame
        while len(self._starts) + len(self._rest) > self.max_frames:
            (self._rest or self._starts).popitem(last=False)

    def frames(self) -> list[bytes]:
        """Run starts first (they make the runs), then the rest in the order they were last updated."""
        return [*self._starts.values(), *self._rest.values()]
