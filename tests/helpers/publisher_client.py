"""A minimal viewer-side client for the publisher's tests: real SUB and DEALER sockets, real decode.

Every wait polls with a deadline, so a test is as fast as the publisher and fails (rather than
hangs) when an expected message never comes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import zmq

from helpers.waiting import wait_until
from publisher.wire.protocol import SNAPSHOT_REQUEST, decode

__all__ = ["Message", "receive", "receive_until", "request_snapshot", "subscribe", "wait_until"]

Message = dict[str, Any]


def subscribe(context: zmq.Context, endpoint: str, **options: int) -> zmq.Socket:
    """A SUB socket connected to ``endpoint`` and subscribed to everything."""
    sub = context.socket(zmq.SUB)
    sub.linger = 0
    for name, value in options.items():
        setattr(sub, name, value)
    sub.subscribe(b"")
    sub.connect(endpoint)
    return sub


def receive(sock: zmq.Socket, timeout_s: float = 2.0) -> Message:
    """The next message, decoded and validated like the viewer does."""
    if not sock.poll(int(timeout_s * 1000)):
        raise AssertionError(f"no message within {timeout_s} s")
    return decode(sock.recv())


def receive_until(
    sock: zmq.Socket, wanted: Callable[[Message], bool], timeout_s: float = 2.0
) -> list[Message]:
    """Messages received up to and including the first one ``wanted`` accepts."""
    deadline = time.monotonic() + timeout_s
    received = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"wanted message not received within {timeout_s} s; got {len(received)}")
        message = receive(sock, remaining)
        received.append(message)
        if wanted(message):
            return received


def request_snapshot(
    context: zmq.Context, snapshot_endpoint: str, request: bytes = SNAPSHOT_REQUEST, timeout_s: float = 2.0
) -> tuple[Message, list[Message]]:
    """Ask for a snapshot from a DEALER as the protocol says; returns (header, messages)."""
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(snapshot_endpoint)
        dealer.send(request)
        if not dealer.poll(int(timeout_s * 1000)):
            raise AssertionError(f"no snapshot reply within {timeout_s} s")
        header_frame, *frames = dealer.recv_multipart()
    finally:
        dealer.close()
    header = json.loads(header_frame)
    return header, [decode(frame) for frame in frames]
