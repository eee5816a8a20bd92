"""A relay: XSUB in, XPUB out, ZeroMQ's steerable proxy between them on a thread of its own.

The forwarding is libzmq's proxy (zmq_proxy_steerable(3)): it moves frames between the sockets in
C (libzmq's proxy forwards millions of messages a second since libzmq PR #3440), and subscriptions
travel the other way, so a viewer that subscribes to events only receives events only, from every
publisher below (:mod:`publisher.wire.topics`; the zguide, chapter 2, "The Dynamic Discovery
Problem", on XSUB/XPUB proxies). That proxy has no hook to look at a frame: whatever enters it
reaches every subscriber whose prefix matches, junk included. So what enters it is checked first,
where that is cheap:

- A node relay's ranks' frames enter an intake SUB socket of its main thread, subscribed to
  everything and connected to each publisher (those the run registry names, found as ``tuimon
  watch`` finds them, and any ``--from`` address). The main thread decodes each frame once
  (:func:`publisher.wire.protocol.decode`), counts one that does not decode by reason and drops it
  alone, and sends each valid frame, byte for byte, on the inproc PUB the proxy's XSUB reads; the
  decoded messages go to the analysis (:mod:`tuimon.relay.analysis`) without a second decode. A
  node's ranks are a handful of streams, so one decode a frame costs the node little; the thread
  waits on the intake with a poller, so a frame is forwarded as it comes (in one batch when many
  wait). A new publisher is one ``connect`` on that socket, which the main thread owns: the proxy
  runs from start to stop. A rank heard after its start is asked for its snapshot once, and what
  the relay missed of it (its ``run_start``, events, invariants) joins the stream the same way
  (:mod:`tuimon.relay.catchup`).
- A root relay's inputs are node relays, which forward only valid frames, so its XSUB binds its
  intake and its proxy carries everything in C: the root is where the volume is (every node's
  streams). Its analysis reads a side SUB socket on its own XPUB, subscribed to the types it needs.
  (A ``--from`` given to a root is forwarded as it comes: publishers belong behind node relays.)

The main thread also publishes the relay's heartbeat, a ``relay`` message, into the stream it
forwards: what it listens on, where it forwards to, the publishers it found, and its counters
(frames in: at a node its intake's, malformed ones included, at a root its proxy's; frames out of
the proxy: its ``STATISTICS``; the malformed frames by count).

A node relay's XPUB binds ``--listen`` (viewers on the node) and, with ``--upstream ADDR``, also
connects to the root's intake (:func:`~tuimon.relay.addresses.ingest_address`): one socket, two
kinds of subscribers, each sent only what it subscribed to. A root binds both of its sockets.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from publisher.wire import snapshot_gate
from publisher.wire.curve import HANDSHAKE_FAILURES, Guard, JobKeys, client_keys, refusal, server_keys
from publisher.wire.hostname import host_name
from publisher.wire.protocol import encode_fitted, make_message
from publisher.wire.registry import RegistryEntry, live_entries
from tuimon.errors import UserError
from tuimon.relay.addresses import ingest_address
from tuimon.relay.analysis import Analysis
from tuimon.relay.catchup import Catchup
from tuimon.relay.proxy import Proxy

log = logging.getLogger(__name__)

#: Frames a relay queues per peer before ZeroMQ drops (the publishers' own high-water mark is 10,000).
QUEUE_FRAMES = 100_000
#: Seconds between looks at the run registry's folder for new publishers; its entries are read
#: (each file parsed, each process checked alive) when the folder's names changed, else every
#: :data:`REGISTRY_CHECK_S` (a process that died without removing its entry): reading 64 entries
#: every second cost a node relay 8 % of a core.
REGISTRY_SCAN_S = 1.0
REGISTRY_CHECK_S = 10.0
#: Publishers named in one heartbeat (a node has a handful; the count is always exact).
MAX_LISTED = 64
#: Seconds between two rounds of the main thread's own work (scans, beats, summaries); a root
#: drains its side socket in one batch a round rather than waking for each message (ZeroMQ queues
#: them meanwhile), so its cost follows the messages' number, not their arrival pattern. A node
#: relay forwards its intake between rounds, as frames come.
_TICK_S = 0.05
#: Frames the main thread reads from a socket in one go.
_DRAIN_FRAMES = 10_000
_ids = itertools.count()


@dataclass
class _Sources:
    """Publisher addresses the relay is connected to (a node: its intake; a root: its XSUB), and
    the registry entries they came from."""

    given: list[str]
    found: dict[str, RegistryEntry] = field(default_factory=dict)  # pub address -> entry

    def addresses(self) -> set[str]:
        return {*self.given, *self.found}


class Relay:
    """One relay's sockets (bound and connected at construction, so a bad address fails at once)
    and its proxies. :meth:`serve` runs until its ``stop`` event is set.

    ``registry_dir``: the run registry a node relay scans for its node's publishers (a root has
    none: its inputs are node relays).

    ``keys`` (:mod:`publisher.wire.curve`): a socket bound beyond loopback serves CURVE with them
    (and cannot be bound without them unless ``insecure``); the link to the root joins with them
    when the root is beyond loopback or ``explicit_keys``.
    """

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
        keys: JobKeys | None = None,
        explicit_keys: bool = False,
        insecure: bool = False,
    ) -> None:
        if root and registry_dir is not None:
            raise ValueError("a root relay does not scan a run registry: its inputs are node relays")
        self.root = root
        self.upstream = upstream
        self.registry_dir = registry_dir
        try:
            self.host = host or host_name()
        except ValueError as exc:  # a bad $TUIMON_HOST
            raise UserError(str(exc)) from None
        self.heartbeat_s = heartbeat_s
        self._sources = _Sources(list(sources))
        self._seq = 0
        self._guard: Guard | None = None
        self._proxies: list[Proxy] = []  # the local proxy, then the uplink's when there is one
        self._made: list[bytes] = []  # a node relay's own messages, for its analysis
        self._received = self._received_bytes = 0  # at a node relay's intake, malformed included
        self._watched: list[zmq.Socket] = []  # monitors of the sockets serving CURVE
        self._catchup: Catchup | None = None  # a node relay's: the ranks it heard late, asked for their start
        self._uplinked = upstream is None  # whether what it forwards reaches its root yet
        self._next_uplink_check = 0.0
        self._registry_names: frozenset[str] | None = None  # the registry folder's, when last read
        self._registry_checked = 0.0
        self.refused = 0
        self._refusal_said_at = -math.inf
        # A node relay summarises its ranks; the top of the tree (nobody above) judges the job.
        self.analysis = Analysis(self.name, self.host, summarize=not root, watch=upstream is None)
        self._context = zmq.Context()
        try:
            self._wire(listen, keys, explicit_keys, insecure)
        except BaseException:
            self._close()
            raise

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._context.socket(kind)
        sock.linger = 0
        if kind in (zmq.XSUB, zmq.SUB):
            sock.rcvhwm = QUEUE_FRAMES
        else:
            sock.sndhwm = QUEUE_FRAMES
        return sock

    def _serving(
        self, sock: zmq.Socket, address: str, keys: JobKeys | None, insecure: bool, what: str
    ) -> str:
        """Bind ``sock`` for ``what``, as a CURVE server when the address reaches other machines."""
        try:
            serve = server_keys(address, keys, insecure=insecure, what=f"a relay listening for {what}")
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if serve is not None:
            if self._guard is None:
                self._guard = Guard(self._context, serve)
            serve.serve(sock)
            self._watched.append(sock.get_monitor_socket(HANDSHAKE_FAILURES))
        return _bind(sock, address, what)

    def _wire(self, listen: str, keys: JobKeys | None, explicit_keys: bool, insecure: bool) -> None:
        self._xsub, self._xpub = self._socket(zmq.XSUB), self._socket(zmq.XPUB)
        self.listen = self._serving(self._xpub, listen, keys, insecure, "viewers")
        self.intake = (
            self._serving(self._xsub, ingest_address(self.listen), keys, insecure, "node relays")
            if self.root
            else None
        )
        local = f"inproc://tuimon-relay-local-{next(_ids)}"
        self._xpub.bind(local)  # the uplink and a root's side subscription read the stream here
        self._side: zmq.Socket | None = None  # what a root's analysis reads, on this (the main) thread
        self._intake: zmq.Socket | None = None  # a node's ranks' frames, read on this thread
        if self.root:
            self._side = self._socket(zmq.SUB)
            for topic in self.analysis.topics():
                self._side.subscribe(topic)
            self._side.connect(local)
        else:
            self._intake = self._socket(zmq.SUB)
            self._intake.subscribe(b"")  # validated here, then filtered by the proxy's subscribers
            # Publishers serve plain on their node's loopback; beyond it, with the job's keys.
            self._catchup = Catchup(
                self._context,
                lambda address: client_keys(address, keys, explicit=False),
                self.analysis.decoded,
            )
        if self.upstream is not None:
            # Its own proxy: CURVE is a property of a socket, and the root link may need it while
            # the node's own viewers connect in plain on loopback.
            up_in, up_out = self._socket(zmq.XSUB), self._socket(zmq.XPUB)
            up_in.connect(local)
            joining = client_keys(self.upstream, keys, explicit=explicit_keys)
            if joining is not None:
                joining.join(up_out)
            up_out.connect(ingest_address(self.upstream))
            self._proxies.append(Proxy(self._context, up_in, up_out, "uplink"))
        # Late joiners ask here for the job's state (its address is in every beat).
        self._snapshots = snapshot_gate.snapshot_socket(self._context)
        self._gate = snapshot_gate.SnapshotGate()
        self.snapshot = self._serving(
            self._snapshots, _any_port(self.listen), keys, insecure, "snapshot requests"
        )
        own = f"inproc://tuimon-relay-own-{next(_ids)}"
        # The relay's own messages, and a node's valid frames, join the stream it forwards here.
        self._own = self._socket(zmq.PUB)
        self._own.bind(own)
        self._xsub.connect(own)
        for address in self._sources.given:
            (self._xsub if self._intake is None else self._intake).connect(address)
        self._local = Proxy(self._context, self._xsub, self._xpub, "proxy")
        self._proxies.insert(0, self._local)

    @property
    def name(self) -> str:
        return f"{'root' if self.root else 'node'}@{self.host}"

    # --------------------------------------------------------------------------------- running

    def serve(self, stop: threading.Event) -> None:
        """Forward until ``stop`` is set. Meanwhile, at a node, validate the ranks' frames into the
        proxy as they come; every ``_TICK_S``, send what the analysis makes (a root's reads its side
        socket), scan for publishers and beat."""
        for proxy in self._proxies:
            proxy.start()
        poller = zmq.Poller()
        if self._intake is not None:
            poller.register(self._intake, zmq.POLLIN)
        next_scan = next_beat = next_serve = 0.0
        next_round = time.monotonic()
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_round:
                    next_round = now + _TICK_S
                    if self.registry_dir is not None and now >= next_scan:
                        self._rescan()
                        next_scan = now + REGISTRY_SCAN_S
                    if now >= next_beat:
                        self._beat()
                        next_beat = now + self.heartbeat_s
                    for msg_type, run, rank, host, step, body in self.analysis.due(now):
                        self._send(msg_type, run, rank, host, step, body)
                    if self._side is None:
                        self.analysis.feed(self._made, now)  # a node's own messages of this round
                        self._made.clear()
                    else:
                        self.analysis.feed(_drain(self._side), now)
                    self._read_refusals()
                    self._catch_up(now)
                    if now >= next_serve:
                        snapshot_gate.serve_requests(self._snapshots, self._gate, self._job_state)
                        next_serve = now + snapshot_gate.SERVE_INTERVAL_S
                self._wait(stop, poller, next_round)
        finally:
            self._close()

    def _wait(self, stop: threading.Event, poller: zmq.Poller, until: float) -> None:
        """Until ``until`` (the next round) or the first frame at a node's intake, then forward what
        the intake holds."""
        timeout = max(until - time.monotonic(), 0.0)
        if self._intake is None:
            stop.wait(timeout)
        elif poller.poll(math.ceil(timeout * 1000)):
            self._forward(_drain(self._intake), time.monotonic())

    def _forward(self, frames: list[bytes], now: float) -> None:
        """A node's ranks' frames, each decoded once: a valid one goes on into the proxy byte for
        byte (never blocking: at the high-water mark ZeroMQ drops, as a publisher does) and to the
        analysis; one that does not decode is counted by reason and dropped alone."""
        self._received += len(frames)
        self._received_bytes += sum(map(len, frames))
        valid = list(self.analysis.decoded(frames))
        self._pass(valid, now)
        if self._catchup is not None:
            self._catchup.heard((message for _, message in valid), now, asking=self._uplinked)

    def _pass(self, valid: list[tuple[bytes, dict[str, Any]]], now: float) -> None:
        """Checked frames into the proxy, byte for byte, and to the analysis."""
        for frame, _ in valid:
            with contextlib.suppress(zmq.Again):
                self._own.send(frame, zmq.NOBLOCK)
        self.analysis.observe(valid, now)

    def _catch_up(self, now: float) -> None:
        """What the ranks heard late had said before (:mod:`tuimon.relay.catchup`), into the stream;
        asked for only once the root hears this relay (its first subscription came up the uplink),
        so that a rank's start is not sent to nobody."""
        if self._catchup is None:
            return
        if not self._uplinked and self._catchup.pending and now >= self._next_uplink_check:
            self._next_uplink_check = now + REGISTRY_SCAN_S  # a question to the proxy's thread
            self._uplinked = self._proxies[-1].subscribed()
        self._pass(self._catchup.missed(now), now)

    def _close(self) -> None:
        for proxy in self._proxies:
            proxy.stop()
        if self._catchup is not None:
            self._catchup.close()
        if self._guard is not None:
            self._guard.stop()
        self._context.destroy(linger=0)

    def _job_state(self) -> tuple[list[bytes], int]:
        """A late joiner's snapshot: the job's kept frames (their ``seq`` are many senders', so the
        header's is -1: every live message after it applies)."""
        return self.analysis.history.frames(), -1

    def _read_refusals(self) -> None:
        """Count peers refused by CURVE, and say so (at most every 10 s: a refused peer retries)."""
        for monitor in self._watched:
            for raw in _drain(monitor, multipart=True):
                event = parse_monitor_message(raw)
                self.refused += 1
                now = time.monotonic()
                if now - self._refusal_said_at >= 10.0:
                    self._refusal_said_at = now
                    log.warning(
                        "tuimon relay: %s", refusal(event, serving=True)
                    )

    def statistics(self) -> dict[str, int]:
        """The forwarding counters so far: messages and bytes in (a node: at its intake, malformed
        ones included; a root: into its proxy) and out of the proxy."""
        counters = self._local.statistics()
        if self._intake is not None:
            counters["in"], counters["in_bytes"] = self._received, self._received_bytes
        return counters

    def _rescan(self) -> None:
        """Connect a node's intake to publishers that appeared in the registry, drop those that
        went away (the entries are read when the folder's names changed, or are due a check)."""
        assert self._intake is not None and self.registry_dir is not None
        try:
            names = frozenset(os.listdir(self.registry_dir))
        except OSError:
            names = frozenset()
        now = time.monotonic()
        if names == self._registry_names and now < self._registry_checked + REGISTRY_CHECK_S:
            return
        self._registry_names, self._registry_checked = names, now
        entries = {entry.pub: entry for entry in live_entries(self.registry_dir)}
        for address in [address for address in entries if address not in self._sources.found]:
            try:
                self._intake.connect(address)
            except zmq.ZMQError as exc:
                log.warning("tuimon relay: cannot connect to %s (%s)", address, exc)
                continue
            entry = self._sources.found[address] = entries[address]
            if self._catchup is not None and entry.snapshot:
                self._catchup.addresses[(entry.run, entry.rank)] = entry.snapshot
        for address in [address for address in self._sources.found if address not in entries]:
            del self._sources.found[address]
            with contextlib.suppress(zmq.ZMQError):  # ZeroMQ may have dropped it already
                self._intake.disconnect(address)

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
                "snapshot": self.snapshot,
                "upstream": self.upstream,
                "publishers": len(self._sources.addresses()),
                "ranks": [{"run": e.run, "rank": e.rank, "host": e.host} for e in found[:MAX_LISTED]],
                "stats": {
                    **self.statistics(),
                    "malformed": sum(self.analysis.malformed.values()),
                    "refused": self.refused,
                },
            },
        )

    def _send(
        self, msg_type: str, run: str, rank: int, host: str, step: int | None, body: dict[str, Any]
    ) -> None:
        """One message of the relay's own into the stream (numbered by the relay); a node's
        analysis reads it at the end of the round (a root's, back from its side socket)."""
        message = make_message(
            msg_type, run=run, rank=rank, host=host, ts=time.time(), seq=self._seq, step=step, **body
        )
        self._seq += 1
        try:
            frame = encode_fitted(message)
        except ValueError as exc:  # over its type's bound even without its free-form parts
            log.warning("tuimon relay: a %s message not sent: %s", msg_type, exc)
            return
        with contextlib.suppress(zmq.Again):  # nobody subscribed: nothing is kept for later
            self._own.send(frame, zmq.NOBLOCK)
        if self._intake is not None:
            self._made.append(frame)


def _any_port(address: str) -> str:
    """A free port on the interface of ``address`` (tcp), or a socket beside it (ipc)."""
    if address.startswith("tcp://"):
        return address.rpartition(":")[0] + ":*"
    return address + ".snapshot"


def _drain(sock: zmq.Socket, *, multipart: bool = False) -> list[Any]:
    """What ``sock`` holds now: frames, or whole multipart messages."""
    receive = sock.recv_multipart if multipart else sock.recv
    frames = []
    for _ in range(_DRAIN_FRAMES):
        try:
            frames.append(receive(zmq.NOBLOCK))
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
