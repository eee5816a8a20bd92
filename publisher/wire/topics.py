"""Subscription prefixes: choose messages by type, run and rank without a byte of Python per message.

ZeroMQ filters PUB/SUB traffic by prefix on the first frame, in C, on the sender's side over tcp
and ipc, and XPUB/XSUB proxies carry subscriptions upstream hop by hop (the zguide, chapter 2,
"Pub-Sub Message Envelopes"). Every message's JSON starts with its envelope in a fixed order,
``{"v":1,"type":...,"run":...,"rank":...,`` (:func:`publisher.wire.protocol.make_message`,
documented in docs/protocol.md), so that prefix *is* the topic: a viewer of a whole job subscribes
to events and heartbeats only, and drilling into one rank is one more subscription that travels up
the relays to that rank's node relay (which takes its few local ranks' whole streams, to check
each frame before it forwards it). No frame is added and old readers are unaffected.
"""

from __future__ import annotations

import orjson

from publisher.wire.protocol import MESSAGE_TYPES, PROTOCOL_VERSION

#: Subscribe to this to receive everything.
EVERYTHING = b""


def subscription(msg_type: str | None = None, run: str | None = None, rank: int | None = None) -> bytes:
    """The prefix that selects messages of ``msg_type`` (of ``run``, of ``rank``): narrower as more
    is given. A run needs a type, a rank needs a run; the rank ends with its comma, so rank 1 does
    not also select rank 17."""
    if msg_type is None:
        if run is not None or rank is not None:
            raise ValueError("a subscription to a run or a rank needs a message type")
        return EVERYTHING
    if msg_type not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {msg_type!r}; expected one of {sorted(MESSAGE_TYPES)}")
    prefix = b'{"v":%d,"type":%s' % (PROTOCOL_VERSION, orjson.dumps(msg_type))
    if run is None:
        if rank is not None:
            raise ValueError("a subscription to a rank needs its run")
        return prefix + b","
    prefix += b',"run":' + orjson.dumps(run)
    if rank is None:
        return prefix + b","
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"a rank is a whole number from 0, got {rank!r}")
    return prefix + b',"rank":%d,' % rank
