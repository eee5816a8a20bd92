"""A publisher reduced to the protocol, to test the viewer against the contract.

:class:`RawPublisher` drives real ZeroMQ PUB and ROUTER sockets on 127.0.0.1 exactly as
docs/protocol.md says, so the receiver is tested against the contract rather than against one
implementation of it (tests with the real ``publisher.wire.transport.Publisher`` exist as well).
"""

from __future__ import annotations

import json
import time
from typing import Any

import zmq

from helpers.runs import RunBuilder
from publisher.wire.protocol import encode


class RawPublisher:
    """A publisher reduced to the protocol: a PUB and a snapshot ROUTER on random loopback ports.

    Driven from the test's thread (its sockets are used by that thread only). It keeps what it
    sent so that a snapshot can be built from it and the test can compare what the viewer shows.
    """

    def __init__(self, context: zmq.Context, run: str = "raw", rank: int = 0) -> None:
        self.builder = RunBuilder(run, rank, t0=time.time())
        self.pub = context.socket(zmq.PUB)
        self.pub.linger = 0
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind("tcp://127.0.0.1:*")
        self.snapshot_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sent: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        self.pub.send(encode(message))
        self.sent.append(message)
        return message

    def send_new(self, msg_type: str, step: int | None = None, **body: Any) -> dict[str, Any]:
        self.builder.ts = time.time()
        return self.send(self.builder.message(msg_type, step=step, **body))

    def metrics(self, step: int, loss: float) -> dict[str, Any]:
        self.builder.ts = time.time()
        return self.send(self.builder.metrics(step, loss=loss))

    def metrics_in_flight(self, step: int, loss: float) -> dict[str, Any]:
        """A metrics message numbered and kept (a snapshot holds it) whose frame is still on its
        way to the viewers: :meth:`deliver` sends it."""
        self.builder.ts = time.time()
        message = self.builder.metrics(step, loss=loss)
        self.sent.append(message)
        return message

    def deliver(self, message: dict[str, Any]) -> None:
        """The frame of a message kept earlier (:meth:`metrics_in_flight`) reaches the viewers."""
        self.pub.send(encode(message))

    def heartbeat(self, step: int) -> dict[str, Any]:
        self.builder.ts = time.time()
        return self.send(self.builder.heartbeat(step, snapshot=self.snapshot_endpoint))

    def poll_request(self, timeout_ms: int = 0) -> bytes | None:
        """The identity of a viewer that asked for a snapshot, if one did."""
        if not self.router.poll(timeout_ms):
            return None
        identity, request = self.router.recv_multipart()
        assert json.loads(request) == {"v": 1, "type": "snapshot_request"}
        return identity

    def snapshot_frames(self) -> tuple[int, list[bytes]]:
        """What the protocol requires a snapshot to hold, built from everything sent so far."""
        kept = [m for m in self.sent if m["type"] in ("run_start", "metrics", "event")]
        latest: dict[Any, dict[str, Any]] = {}
        for message in self.sent:
            if message["type"] == "invariant":
                latest[("invariant", message["name"])] = message
            elif message["type"] == "gpu":
                latest["gpu"] = message
        chosen = sorted(kept + list(latest.values()), key=lambda m: m["seq"])
        return self.sent[-1]["seq"], [encode(m) for m in chosen]

    def reply(self, identity: bytes, seq: int, frames: list[bytes]) -> None:
        header = json.dumps({"v": 1, "type": "snapshot", "seq": seq, "count": len(frames)}).encode()
        self.router.send_multipart([identity, header, *frames])

    def close(self) -> None:
        self.pub.close(0)
        self.router.close(0)
