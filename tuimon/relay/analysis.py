"""What a relay does with the stream besides forwarding it, on its main thread.

A node relay reads its ranks' ``metrics``, ``gpu`` and heartbeats to make the node's summaries
(:mod:`tuimon.relay.summary`); the relay at the top of the tree (the root, or a node relay with
nobody above it) reads summaries and relay beats to judge the job (:mod:`tuimon.relay.watch`);
every relay keeps the job's state for viewers that join late (:mod:`tuimon.relay.history`).
Everything it produces goes back into the stream as ordinary messages, so viewers, ``tuimon tail``
and the root see them like any other.

Where the messages come from differs. A node relay decodes each of its ranks' frames once, to
forward only the valid ones (:mod:`tuimon.relay.forwarder`), and hands the decoded messages here
with :meth:`Analysis.observe`, with its own messages. The root reads a side SUB socket on its own
XPUB that subscribes only to the types it needs (:meth:`Analysis.topics`; ZeroMQ filters the rest
before Python sees them) and gives the frames to :meth:`Analysis.feed`, which decodes them.

A frame that does not decode is counted by reason (the relay's heartbeat reports it) and skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from publisher.wire.protocol import RELAY_REPEAT_S, ProtocolError, decode, latest_update
from publisher.wire.topics import subscription
from tuimon.relay.history import KEPT_TYPES, JobHistory
from tuimon.relay.summary import DEFAULT_PERIOD_S, NodeSummarizer
from tuimon.relay.watch import JobWatch

#: What a node relay's summaries are made of.
_SUMMARIZED = ("metrics", "gpu", "heartbeat", "run_end")
#: (type, run, rank, host, step, body) of a message the relay is to send.
Outgoing = tuple[str, str, int, str, int | None, dict[str, Any]]


@dataclass
class _Episode:
    id: str
    step: int | None
    count: int
    sent_at: float
    #: What set the episode off (its first finding's message and details), kept on every update.
    message: str
    details: dict[str, Any]


class Analysis:
    """Summaries (``summarize``) and job judgements (``watch``) of one relay named ``name``."""

    def __init__(self, name: str, host: str, *, summarize: bool, watch: bool) -> None:
        self.name = name
        self.host = host
        self.summarizer = NodeSummarizer(host) if summarize else None
        self.watch = JobWatch() if watch else None
        self.history = JobHistory()  # for viewers that join late, at every relay
        self.malformed: Counter[str] = Counter()
        self.types = set(KEPT_TYPES)  # the types read (at the root: its side socket's topics)
        if self.summarizer is not None:
            self.types |= set(_SUMMARIZED)
        if self.watch is not None:
            self.types |= {"summary", "relay", "run_start", "run_end"}
        self._next_summary = 0.0
        self._episodes: dict[tuple[str, str, object], _Episode] = {}
        self._episode_ids = 0

    def topics(self) -> list[bytes]:
        """What a side socket subscribes to."""
        return [subscription(msg_type) for msg_type in sorted(self.types)]

    def decoded(self, frames: Iterable[bytes]) -> Iterator[tuple[bytes, dict[str, Any]]]:
        """Each frame that decodes, with its message; the others counted by reason and left out."""
        for frame in frames:
            try:
                message = decode(frame)
            except ProtocolError as exc:
                self.malformed[exc.reason] += 1
                continue
            yield frame, message

    def feed(self, frames: Iterable[bytes], now: float) -> None:
        """Frames as they came: decoded here, then :meth:`observe`."""
        self.observe(self.decoded(frames), now)

    def observe(self, decoded: Iterable[tuple[bytes, Mapping[str, Any]]], now: float) -> None:
        """Messages already decoded, each with its frame (kept byte for byte for late joiners);
        those of types not read here are passed over."""
        for frame, message in decoded:
            if message["type"] not in self.types:
                continue
            self.history.keep(frame, message)
            if message.get("by") == self.name:
                continue  # our own findings, kept for late joiners, not judged again
            if self.summarizer is not None and message["type"] in _SUMMARIZED:
                self.summarizer.observe(message, now)
            if self.watch is not None:
                self.watch.observe(message, now)

    def due(self, now: float) -> Iterator[Outgoing]:
        """The summaries and events to send now (call a few times a second)."""
        if now < self._next_summary:
            return
        self._next_summary = now + DEFAULT_PERIOD_S
        if self.summarizer is not None:
            for run, rank, body in self.summarizer.summaries(now):
                yield "summary", run, rank, self.host, None, body
        if self.watch is not None:
            yield from self._events(now)

    def _events(self, now: float) -> Iterator[Outgoing]:
        assert self.watch is not None
        seen = set()
        for finding in self.watch.check(now):
            key = (finding.run, finding.kind, finding.details.get("relay", finding.rank))
            seen.add(key)
            episode = self._episodes.get(key)
            if episode is None:
                self._episode_ids += 1
                step = finding.details.get("step", finding.details.get("last_step"))
                episode = self._episodes[key] = _Episode(
                    f"{self.name}/{self._episode_ids}",
                    step if isinstance(step, int) else None,
                    0,
                    -RELAY_REPEAT_S,
                    finding.message,
                    finding.details,
                )
            if now - episode.sent_at < RELAY_REPEAT_S:
                continue
            episode.count += 1
            episode.sent_at = now
            body: dict[str, Any] = {
                "id": episode.id,
                "kind": finding.kind,
                "severity": finding.severity,
                "message": episode.message,
                "details": episode.details,
                "count": episode.count,
                "by": self.name,
            }
            if episode.count > 1:
                latest_step = finding.details.get("step")
                body["latest"] = latest_update(latest_step if isinstance(latest_step, int) else None,
                                               finding.message, details=finding.details,
                                               first_details=episode.details)
            yield (
                "event",
                finding.run,
                finding.rank,
                finding.details.get("host", self.host),
                episode.step,
                body,
            )
        for key in [key for key in self._episodes if key not in seen]:
            del self._episodes[key]  # over: a later one is a new episode
