"""Asking a publisher (or a relay) for its snapshot, and reading the reply: the client half of the
clone pattern (docs/protocol.md, "Late joiners: snapshot"; the zguide, chapter 5).

Shared by everything that joins a stream late: the viewer's :class:`~tuimon.sources.receiver.Receiver`
(a rank's history, a relay's job state) and a node relay that found a rank after it started
(:mod:`tuimon.relay.catchup`). The server half is :mod:`publisher.wire.snapshot_gate`.
"""

from __future__ import annotations

import json

import zmq

from publisher.wire.curve import JobKeys
from publisher.wire.protocol import SNAPSHOT_REQUEST

#: What a node relay forwards of the snapshot of a rank it found late (:mod:`tuimon.relay.catchup`):
#: what the rank says once or per episode. Through a relay these may come after the rank's later
#: messages.
CAUGHT_UP_TYPES = ("run_start", "event", "invariant", "run_end")


def ask(context: zmq.Context, address: str, keys: JobKeys | None) -> zmq.Socket:
    """A DEALER that has sent the snapshot request to ``address`` (joining with ``keys`` when they
    are given); the caller polls it for the reply and closes it. ZMQError if it could not ask."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.join(dealer)
    try:
        dealer.connect(address)
        dealer.send(SNAPSHOT_REQUEST, zmq.NOBLOCK)
    except zmq.ZMQError:
        dealer.close(linger=0)
        raise
    return dealer


def read_reply(frames: list[bytes]) -> tuple[int, list[bytes]]:
    """A reply's last ``seq`` (its header's) and its message frames, not yet decoded; ValueError
    when the header is not a snapshot header."""
    try:
        header = json.loads(frames[0])
        seq = header["seq"]
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a snapshot header ({exc!r})") from None
    if not isinstance(header, dict) or header.get("type") != "snapshot" or not isinstance(seq, int):
        raise ValueError("not a snapshot header")
    return seq, frames[1:]
