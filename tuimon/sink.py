"""Where a source puts what it hears: one :class:`Sink` interface of two methods, and what they carry.

A :class:`~tuimon.sources.receiver.Receiver` (or a recording played back) hands a sink whole
batches (:class:`Batch`) of decoded, validated messages, already in the order to apply them, and
tells it :data:`News`: a :class:`Notice` for the user or how the source stands (:class:`SourceStatus`).
The store fills itself from them, ``tuimon tail`` prints them, the Prometheus exporter keeps the
latest figures, and the alert tap listens in on the way to another sink; each overrides only what
it uses, the way :class:`asyncio.Protocol` leaves every callback doing nothing until overridden.

A batch is made once per drain of the socket, never per message, so the hot path stays a list
handed on. This module imports nothing heavy: commands subclass :class:`Sink` at import time and
``tuimon --help`` stays instant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from publisher.wire.protocol import ProtocolError

#: A frame that was not a valid message, and where it came from when that helps (``"run.jsonl:17"``).
Malformed: TypeAlias = "tuple[ProtocolError, str | None]"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The late joiner's snapshot a batch begins with: one sender's history before joining.

    Its first ``size`` messages are the snapshot's, whose last message is ``seq`` (a snapshot holds
    a selection: gaps between its ``seq`` are expected); the rest are the sender's live messages
    numbered after ``seq``, buffered while the snapshot was on its way.
    """

    run: str
    rank: int
    seq: int
    size: int


@dataclass(frozen=True, slots=True)
class Batch:
    """What was heard in one go, in the order to apply it; never changed once made.

    ``received``: the frames read for it (None: one per message and per malformed frame, as for a
    recording); live messages buffered for a snapshot were counted when they arrived, so a
    receiver says 0 when it hands them over. ``complete`` False: the senders' streams are filtered
    (through a relay), so a jump in ``seq`` is not a loss. ``snapshot``: the batch begins with
    that sender's snapshot (:class:`Snapshot`), spliced before its live messages by the receiver.
    """

    messages: Sequence[Mapping[str, Any]]
    received: int | None = None
    malformed: Sequence[Malformed] = ()
    complete: bool = True
    snapshot: Snapshot | None = None

    @property
    def history(self) -> Sequence[Mapping[str, Any]]:
        """The snapshot's messages, from before joining (none unless the batch is a snapshot)."""
        return self.messages[: self.snapshot.size] if self.snapshot is not None else ()

    @property
    def live(self) -> Sequence[Mapping[str, Any]]:
        """The messages heard live: all of them, unless the batch begins with a snapshot."""
        return self.messages[self.snapshot.size :] if self.snapshot is not None else self.messages


@dataclass(frozen=True, slots=True)
class Notice:
    """A line for the user under ``key`` (``text`` None clears it), e.g. "nothing heard from ...";
    with ``ttl_s`` it lapses after that many seconds unless said again."""

    key: str
    text: str | None
    ttl_s: float | None = None


@dataclass(frozen=True)
class SourceStatus:
    """What the source is doing: live or replay, with replay position and speed."""

    kind: str = "live"
    detail: str = ""
    speed: float | None = None
    paused: bool = False
    position: float = 0.0
    position_ts: float | None = None
    duration_s: float = 0.0


#: What a source has to say besides messages.
News: TypeAlias = Notice | SourceStatus


class Sink:
    """Where a source puts what it hears. Both methods do nothing here: a sink overrides what it
    uses. The source calls them from its own thread; an alert courier tells from its own too
    (:mod:`tuimon.notify.courier`), so a sink that keeps notices guards them itself."""

    def deliver(self, batch: Batch) -> None:
        """Messages heard (in order), the malformed frames among them, and how they were heard."""

    def tell(self, news: News) -> None:
        """A :class:`Notice` for the user, or how the source stands (:class:`SourceStatus`)."""
