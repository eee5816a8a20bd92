"""Who gets a snapshot, and how often: the publisher's defence against whatever reaches its socket.

A publisher's snapshot socket is open to every user of the node (and beyond, when bound off
loopback). When the publisher ran in the training process, serving it cost training CPU time, on
the sender thread but under the same interpreter lock: a flood of junk frames measured 4-6x slower
steps, a flood of valid requests (each answered with megabytes) 2x, and the backlog kept training
1.5x slower for a minute after the flood ended (benchmarks/flood.py); a Monitor's publisher now
runs in a process of its own (:mod:`publisher.wire.sidecar`), where a flood costs a core. So the
socket is read on a schedule, not on demand: at most :data:`FRAMES_PER_SERVE` frames every
:data:`SERVE_INTERVAL_S` (the rest wait in ZeroMQ's small per-peer queues, which drop beyond their
mark, in C), junk is refused by its length before any parsing, and replies are metered: per peer,
overall, and in bytes per second (token buckets). A refused request gets no reply; the viewer shows
the run live without history after its snapshot timeout, and asks again when it reconnects. Each
connection is answered once (a viewer asks once, then disconnects), so a peer that keeps asking
gets nothing more.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable

import zmq

from publisher.wire.protocol import PROTOCOL_VERSION, SNAPSHOT_REQUEST, encode

#: How often the snapshot socket is looked at, and how many frames are read each time: whatever
#: arrives, the sender thread handles at most 40 frames a second (reading is what lets ZeroMQ
#: take in more of a flood, so this also bounds its own work on it).
SERVE_INTERVAL_S = 0.1
FRAMES_PER_SERVE = 4
#: A snapshot request is 37 bytes; ZeroMQ disconnects a peer that sends a frame over this, in C.
MAX_REQUEST_BYTES = 256
#: Frames ZeroMQ queues per peer before it drops the rest (the flood never reaches Python).
RECEIVE_HWM = 16
#: Replies queued per peer: a viewer reads its one reply.
SEND_HWM = 1
#: Replies a second overall (with a burst) and bytes a second: a viewer needs one snapshot when
#: it joins; at 2 a second, several viewers joining at once wait a second at most, and a 3 MB
#: history costs the process about 1 % of a core. One reply per peer (connection): a viewer asks
#: once and disconnects.
REPLIES_PER_S = 2.0
REPLY_BURST = 4.0
BYTES_PER_S = 16 * 1024 * 1024
#: Peers remembered as served or as not reading (an attacker making new connections only meets
#: the overall limits).
_PEERS = 4096


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self._tokens = capacity
        self._at: float | None = None

    def allows(self, amount: float, now: float) -> bool:
        """Whether ``amount`` can be spent now. More than the capacity is allowed only from a full
        bucket (a history bigger than a second's worth of bytes is still sent, just not often)."""
        if self._at is not None:
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        return amount <= self._tokens or self._tokens >= self.capacity

    def spend(self, amount: float) -> None:
        self._tokens -= amount


def is_snapshot_request(frame: bytes) -> bool:
    """The request frame, byte for byte, or any JSON spelling of it; judged by length first."""
    if frame == SNAPSHOT_REQUEST:
        return True
    if len(frame) > MAX_REQUEST_BYTES:
        return False
    try:
        request = json.loads(frame)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(request, dict)
        and request.get("v") == PROTOCOL_VERSION
        and request.get("type") == "snapshot_request"
    )


class SnapshotGate:
    """Meters snapshot replies: per peer, overall, in bytes; counts what it refused and why."""

    def __init__(self) -> None:
        self._replies = TokenBucket(REPLIES_PER_S, REPLY_BURST)
        self._bytes = TokenBucket(BYTES_PER_S, 2 * BYTES_PER_S)
        #: Peers already answered (one reply each), or that left a reply unread.
        self._answered: OrderedDict[bytes, None] = OrderedDict()
        #: Frames that were not snapshot requests; requests refused by a limit; replies sent.
        self.bad = 0
        self.refused = 0
        self.served = 0

    def admit(self, peer: bytes, now: float) -> bool:
        """The cheap checks, before the reply is built: this peer's interval, the overall rate."""
        if peer in self._answered or not self._replies.allows(1, now):
            self.refused += 1
            return False
        return True

    def _remember(self, peer: bytes) -> None:
        self._answered[peer] = None
        self._answered.move_to_end(peer)
        if len(self._answered) > _PEERS:
            self._answered.popitem(last=False)

    def charge(self, peer: bytes, now: float, reply_bytes: int) -> bool:
        """Whether an admitted reply of ``reply_bytes`` fits the bytes a second; if so it is
        counted against every limit."""
        if not self._bytes.allows(reply_bytes, now):
            self.refused += 1
            return False
        self._replies.spend(1)
        self._bytes.spend(reply_bytes)
        self._remember(peer)
        self.served += 1
        return True


def snapshot_socket(context: zmq.Context) -> zmq.Socket:
    """A ROUTER set up to be served by :func:`serve_requests`: small queues that drop a flood in C,
    frames over :data:`MAX_REQUEST_BYTES` refused by ZeroMQ, replies that never block."""
    router = context.socket(zmq.ROUTER)
    router.sndhwm = SEND_HWM
    router.router_mandatory = 1  # a reply that cannot be queued raises (caught), never blocks
    router.rcvhwm = RECEIVE_HWM
    router.maxmsgsize = MAX_REQUEST_BYTES
    router.linger = 0
    return router


def serve_requests(
    router: zmq.Socket, gate: SnapshotGate, content: Callable[[], tuple[list[bytes], int]]
) -> None:
    """Answer the snapshot requests waiting on ``router`` (at most :data:`FRAMES_PER_SERVE`) within
    ``gate``'s limits; ``content()`` gives the reply's frames and the last ``seq`` they include
    (the "clone" pattern, docs/protocol.md). Call it every :data:`SERVE_INTERVAL_S`."""
    for _ in range(FRAMES_PER_SERVE):
        try:
            frames = router.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        # Everything before the request is the routing envelope (a DEALER's identity, plus an
        # empty delimiter from a REQ client, plus one identity per proxy hop): echo it back.
        envelope, request = frames[:-1], frames[-1]
        if not envelope or not is_snapshot_request(request):
            gate.bad += 1
            continue
        now = time.monotonic()
        if not gate.admit(envelope[0], now):
            continue
        reply, last_seq = content()
        if not gate.charge(envelope[0], now, sum(map(len, reply))):
            continue
        header = encode({"v": PROTOCOL_VERSION, "type": "snapshot", "seq": last_seq, "count": len(reply)})
        # A viewer that left, or does not read, misses its reply (ZeroMQ refuses to queue it).
        with contextlib.suppress(zmq.ZMQError):
            router.send_multipart([*envelope, header, *reply], zmq.NOBLOCK)
