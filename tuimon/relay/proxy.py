"""One ZeroMQ steerable proxy on a thread of its own, and its counters.

``zmq.proxy_steerable`` moves frames between two sockets in C (libzmq's proxy forwards millions of
messages a second since libzmq PR #3440) and answers commands on a control socket: ``STATISTICS``
(messages and bytes in and out) and ``TERMINATE`` (zmq_proxy_steerable(3)). It forwards every
frame as it is: it has no hook to filter or inspect one, which is why a node relay validates its
ranks' frames before they enter it (:mod:`tuimon.relay.forwarder`). Its sockets belong to its
thread while it runs (ZeroMQ's rule: a socket is used by one thread at a time), so they are wired
before it starts.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
import threading
from dataclasses import dataclass

import zmq

_ids = itertools.count()


@dataclass
class ProxyCounters:
    """What a proxy moved: messages and bytes in (frontend) and out (backend), and the messages
    its backend received (an XPUB backend's: the subscriptions of those it sends to)."""

    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    backend_in: int = 0

    def add(self, frames: list[bytes]) -> None:
        """Add one STATISTICS reply: eight unsigned 64-bit counters (frontend in/out, backend
        in/out, each messages then bytes), in the machine's byte order (zmq_proxy_steerable(3))."""
        values = [struct.unpack("=Q", frame)[0] for frame in frames]
        self.messages_in += values[0]
        self.bytes_in += values[1]
        self.backend_in += values[4]
        self.messages_out += values[6]
        self.bytes_out += values[7]

    def as_dict(self) -> dict[str, int]:
        return {
            "in": self.messages_in,
            "in_bytes": self.bytes_in,
            "out": self.messages_out,
            "out_bytes": self.bytes_out,
        }


class Proxy:
    """``frontend`` -> ``backend`` on a thread. Commands come from the thread that made it."""

    def __init__(self, context: zmq.Context, frontend: zmq.Socket, backend: zmq.Socket, name: str) -> None:
        self.frontend = frontend
        self.backend = backend
        self.name = name
        address = f"inproc://tuimon-proxy-control-{next(_ids)}"
        self._control = context.socket(zmq.PAIR)
        self._control.bind(address)
        self._steered = context.socket(zmq.PAIR)
        self._steered.connect(address)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._forward, name=f"tuimon-{self.name}", daemon=True)
        self._thread.start()

    def _forward(self) -> None:
        with contextlib.suppress(zmq.ContextTerminated):
            zmq.proxy_steerable(self.frontend, self.backend, None, self._steered)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _command(self, command: bytes) -> list[bytes]:
        """A command to the running proxy and its reply (libzmq answers every command)."""
        self._control.send(command)
        if not self._control.poll(2_000):
            raise RuntimeError(f"the relay's {self.name} did not answer {command.decode()}")
        return self._control.recv_multipart()

    def counters(self) -> ProxyCounters:
        """The counters since it started (zeros while it is not running)."""
        counters = ProxyCounters()
        if self.running:
            counters.add(self._command(b"STATISTICS"))
        return counters

    def statistics(self) -> dict[str, int]:
        return self.counters().as_dict()

    def subscribed(self) -> bool:
        """Whether its XPUB backend has had a subscription: someone hears what it forwards."""
        return self.counters().backend_in > 0

    def stop(self) -> None:
        if not self.running:
            return
        with contextlib.suppress(RuntimeError):
            self._command(b"TERMINATE")
        assert self._thread is not None
        self._thread.join(timeout=2.0)
        self._thread = None
