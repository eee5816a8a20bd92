"""A relay: XSUB in, XPUB out, ZeroMQ's steerable proxy between them on a thread of its own.

Messages never pass through Python: ``zmq.proxy_steerable`` moves frames between the sockets in C
(libzmq's proxy forwards millions of messages a second since libzmq PR #3440), and subscriptions
travel the other way, so a viewer that subscribes to events only receives events only, from every
publisher below (:mod:`publisher.wire.topics`). The relay's own thread does the rest, slowly:

- finds the node's publishers in the run registry (as ``tuimon watch`` does) and connects to them,
  plus any address given with ``--from``. A socket belongs to one thread at a time (ZeroMQ's rule),
  so a change of publishers stops the proxy (``TERMINATE``), connects, and starts it again; frames
  wait in the sockets' queues meanwhile;
- publishes its own heartbeat, a ``relay`` message, into the stream it forwards: what it listens
  on, where it forwards to, the publishers it found, and the proxy's counters (``STATISTICS``:
  messages and bytes in and out).

A node relay's XPUB binds ``--listen`` (viewers on the node) and, with ``--upstream ADDR``, also
connects to the root's intake (:func:`~tuimon.relay.addresses.ingest_address`): one socket, two
kinds of subscribers, each sent only what it subscribed to. A root binds both of its sockets.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from publisher.wire.hostname import host_name
from publisher.wire.protocol import encode_fitted, make_message
from publisher.wire.registry import RegistryEntry, live_entries
from tuimon.errors import UserError
from tuimon.relay.addresses import ingest_address
from tuimon.relay.analysis import Analysis

log = logging.getLogger(__name__)

#: Frames a relay queues per peer before ZeroMQ drops (the publishers' own high-water mark is 10,000).
QUEUE_FRAMES = 100_000
#: Seconds between scans of the run registry for new publishers.
REGISTRY_SCAN_S = 1.0
#: Publishers named in one heartbeat (a node has a handful; the count is always exact).
MAX_LISTED = 64
#: Longest wait of the main thread for the side socket (bounds the delay of summaries and beats).
_TICK_MS = 50
#: Frames the main thread reads from the side socket in one go.
_DRAIN_FRAMES = 10_000
_ids = itertools.count()


@dataclass
class RelayCounters:
    """What the proxy moved, summed over its restarts: messages and bytes in (from publishers or
    node relays) and out (to viewers and upstream)."""

    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    restarts: int = 0

    def add(self, frames: list[bytes]) -> None:
        """Add one STATISTICS reply: eight unsigned 64-bit counters (frontend in/out, backend
        in/out, each messages then bytes), in the machine's byte order (zmq_proxy_steerable(3))."""
        values = [struct.unpack("=Q", frame)[0] for frame in frames]
        self.messages_in += values[0]
        self.bytes_in += values[1]
        self.messages_out += values[6]
        self.bytes_out += values[7]

    def as_dict(self) -> dict[str, int]:
        return {
            "in": self.messages_in,
            "in_bytes": self.bytes_in,
            "out": self.messages_out,
            "out_bytes": self.bytes_out,
            "restarts": self.restarts,
        }


@dataclass
class _Sources:
    """Publisher addresses the XSUB is connected to, and the registry entries they came from."""

    given: list[str]
    found: dict[str, RegistryEntry] = field(default_factory=dict)  # pub address -> entry

    def addresses(self) -> set[str]:
        return {*self.given, *self.found}


class Relay:
    """One relay's sockets (bound and connected at construction, so a bad address fails at once)
    and its proxy thread. :meth:`serve` runs until its ``stop`` event is set."""

    def __init__(
        self,
        *,
        listen: str,
        sources: list[str] | tuple[str, ...] = (),
        upstream: str | None = None,
        root: bool = False,
        registry_dir: Path | None = None,
        host: str | None = None,
        heartbeat_s: float = 1.0,
    ) -> None:
        self.root = root
        self.upstream = upstream
        self.registry_dir = registry_dir
        try:
            self.host = host or host_name()
        except ValueError as exc:  # a bad $TUIMON_HOST
            raise UserError(str(exc)) from None
        self.heartbeat_s = heartbeat_s
        self.counters = RelayCounters()
        self._sources = _Sources(list(sources))
        self._seq = 0
        self._thread: threading.Thread | None = None
        # A node relay summarises its ranks; the top of the tree (nobody above) judges the job.
        self.analysis = Analysis(self.name, self.host, summarize=not root, watch=upstream is None)
        self._context = zmq.Context()
        try:
            self._wire(listen)
        except BaseException:
            self._context.destroy(linger=0)
            raise

    def _wire(self, listen: str) -> None:
        context = self._context
        self._xsub = context.socket(zmq.XSUB)
        self._xsub.rcvhwm = QUEUE_FRAMES
        self._xsub.linger = 0
        self._xpub = context.socket(zmq.XPUB)
        self._xpub.sndhwm = QUEUE_FRAMES
        self._xpub.linger = 0
        self.listen = _bind(self._xpub, listen, "viewers")
        self.intake = _bind(self._xsub, ingest_address(self.listen), "node relays") if self.root else None
        if self.upstream is not None:
            self._xpub.connect(ingest_address(self.upstream))
        side = f"inproc://tuimon-relay-side-{next(_ids)}"
        self._xpub.bind(side)
        self._side = context.socket(zmq.SUB)  # what the analysis reads, on this (the main) thread
        self._side.rcvhwm = QUEUE_FRAMES
        self._side.linger = 0
        for topic in self.analysis.topics():
            self._side.subscribe(topic)
        self._side.connect(side)
        own = f"inproc://tuimon-relay-{next(_ids)}"
        self._own = context.socket(zmq.PUB)  # the relay's own messages join the stream it forwards
        self._own.bind(own)
        self._xsub.connect(own)
        for address in self._sources.given:
            self._xsub.connect(address)
        control = f"inproc://tuimon-relay-control-{next(_ids)}"
        self._control = context.socket(zmq.PAIR)
        self._control.bind(control)
        self._proxy_control = context.socket(zmq.PAIR)
        self._proxy_control.connect(control)

    @property
    def name(self) -> str:
        return f"{'root' if self.root else 'node'}@{self.host}"

    # --------------------------------------------------------------------------------- running

    def serve(self, stop: threading.Event) -> None:
        """Forward until ``stop`` is set; meanwhile read the side socket for the analysis, send what
        it makes, scan for publishers and beat."""
        self._start_proxy()
        next_scan = next_beat = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                if self.registry_dir is not None and now >= next_scan:
                    self._rescan()
                    next_scan = now + REGISTRY_SCAN_S
                if now >= next_beat:
                    self._beat()
                    next_beat = now + self.heartbeat_s
                for msg_type, run, rank, host, step, body in self.analysis.due(now):
                    self._send(msg_type, run, rank, host, step, body)
                if self._side.poll(_TICK_MS):
                    self.analysis.feed(_drain(self._side), time.monotonic())
        finally:
            self._stop_proxy()
            self._context.destroy(linger=0)

    def _start_proxy(self) -> None:
        self._thread = threading.Thread(target=self._proxy, name="tuimon-relay-proxy", daemon=True)
        self._thread.start()

    def _proxy(self) -> None:
        with contextlib.suppress(zmq.ContextTerminated):
            zmq.proxy_steerable(self._xsub, self._xpub, None, self._proxy_control)

    def _command(self, command: bytes) -> list[bytes]:
        """A command to the running proxy and its reply (libzmq answers every command)."""
        self._control.send(command)
        if not self._control.poll(2_000):
            raise RuntimeError(f"the relay's proxy did not answer {command.decode()}")
        return self._control.recv_multipart()

    def statistics(self) -> dict[str, int]:
        """The counters so far (the running proxy's added to those of its earlier runs)."""
        now = RelayCounters(**vars(self.counters))
        if self._thread is not None and self._thread.is_alive():
            now.add(self._command(b"STATISTICS"))
        return now.as_dict()

    def _stop_proxy(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):
            self.counters.add(self._command(b"STATISTICS"))
            self._command(b"TERMINATE")
        self._thread.join(timeout=2.0)
        self._thread = None

    def _rescan(self) -> None:
        """Connect to publishers that appeared in the registry, drop those that went away."""
        entries = {entry.pub: entry for entry in live_entries(self.registry_dir)}
        new = [address for address in entries if address not in self._sources.found]
        gone = [address for address in self._sources.found if address not in entries]
        if not new and not gone:
            return
        self._stop_proxy()  # the XSUB is the proxy thread's while it runs
        for address in new:
            try:
                self._xsub.connect(address)
            except zmq.ZMQError as exc:
                log.warning("tuimon relay: cannot connect to %s (%s)", address, exc)
                continue
            self._sources.found[address] = entries[address]
        for address in gone:
            del self._sources.found[address]
            with contextlib.suppress(zmq.ZMQError):  # ZeroMQ may have dropped it already
                self._xsub.disconnect(address)
        self.counters.restarts += 1
        self._start_proxy()

    def _beat(self) -> None:
        found = list(self._sources.found.values())
        self._send(
            "relay",
            self.name,
            0,
            self.host,
            None,
            {
                "role": "root" if self.root else "node",
                "listen": self.listen,
                "upstream": self.upstream,
                "publishers": len(self._sources.addresses()),
                "ranks": [{"run": e.run, "rank": e.rank, "host": e.host} for e in found[:MAX_LISTED]],
                "stats": {**self.statistics(), "malformed": sum(self.analysis.malformed.values())},
            },
        )

    def _send(
        self, msg_type: str, run: str, rank: int, host: str, step: int | None, body: dict[str, Any]
    ) -> None:
        """One message of the relay's own into the stream (numbered by the relay)."""
        message = make_message(
            msg_type, run=run, rank=rank, host=host, ts=time.time(), seq=self._seq, step=step, **body
        )
        self._seq += 1
        with contextlib.suppress(zmq.Again):  # nobody subscribed: nothing is kept for later
            self._own.send(encode_fitted(message), zmq.NOBLOCK)


def _drain(sock: zmq.Socket) -> list[bytes]:
    frames = []
    for _ in range(_DRAIN_FRAMES):
        try:
            frames.append(sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            break
    return frames


def _bind(sock: zmq.Socket, address: str, for_whom: str) -> str:
    """Bind, or a one-line error that names the address and what it was for."""
    if not address.startswith(("tcp://", "ipc://")):
        raise UserError(f"cannot listen on {address!r} for {for_whom}: use tcp://HOST:PORT or ipc://PATH")
    if "[" in address:
        sock.ipv6 = True
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        raise UserError(f"cannot listen on {address} for {for_whom}: {exc.strerror}") from None
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
