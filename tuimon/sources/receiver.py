"""The receiving end of the live protocol: one SUB socket, discovery, and the clone pattern.

Shared by everything that listens to publishers: the dashboard's
:class:`~tuimon.sources.live.LiveSource` (into its Store, on a thread of its own) and
``tuimon tail`` (printing each message, on the main thread). Both get the same discovery, the same
validation and the same late-joiner logic; only the :class:`~tuimon.sink.Sink` they hand in differs.

The receiver polls, then drains with NOBLOCK in batches (a poll per message tops out far lower),
decodes and validates every frame with :func:`publisher.wire.protocol.decode`, and hands each batch
to the sink in one go (:meth:`~tuimon.sink.Sink.deliver`). Nothing that arrives on the wire can
stop it: a bad frame is counted and skipped.

Late joiners follow ZeroMQ's clone pattern (docs/protocol.md): the first message heard from a
sender proves the subscription is live; from then on its messages are buffered while a DEALER asks
the sender's ROUTER for a snapshot (address from its heartbeat or its registry entry). The snapshot
is handed over with the buffered messages whose ``seq`` is above the snapshot's after it, spliced
into one batch here (sinks never splice), and the live frames the snapshot already held that
arrive after it are dropped, so nothing is missed or applied twice. A sender that does
not answer within :data:`SNAPSHOT_TIMEOUT_S` is shown live only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from publisher.wire.curve import HANDSHAKE_FAILURES, JobKeys, client_keys, refusal
from publisher.wire.protocol import ProtocolError, decode, numbered_by_sender
from publisher.wire.registry import live_entries
from tuimon.sink import Batch, Malformed, Notice, Sink, Snapshot, SourceStatus
from tuimon.sources import snapshot_client
from tuimon.sources.subscriptions import Subscriptions

#: Seconds to wait for a snapshot reply before showing the sender's live messages only.
SNAPSHOT_TIMEOUT_S = 2.0
#: Seconds to wait for a sender's first heartbeat (it carries the snapshot address).
HEARTBEAT_WAIT_S = 2.0
#: Seconds between scans of the registry for new runs.
REGISTRY_SCAN_S = 2.0
#: Seconds of silence from an explicit endpoint before the screen says so.
SILENT_ENDPOINT_S = 5.0
#: Frames read per drain before they are handed over (bounds the time a store's lock is held).
BATCH_FRAMES = 5_000
#: Live messages buffered per sender while its snapshot is pending; beyond it, carry on live.
BUFFER_LIMIT = 200_000
#: Messages the SUB socket queues before ZeroMQ drops (visible as gaps in ``seq``).
RECEIVE_HWM = 200_000
#: What the "no runs yet" notice suggests.
WAITING_HINT = "waiting for runs — start one with the publisher or `tuimon run`"
_POLL_MS = 50
_STATUS_EVERY_S = 0.25


def describe_targets(endpoints: Sequence[str], registry_dir: Path | None) -> str:
    """Where a receiver looks, in words (for "waiting" messages and the status line)."""
    if endpoints:
        return ", ".join(endpoints)
    return f"the run registry {registry_dir}"


def decode_all(frames: Iterable[bytes]) -> tuple[list[dict[str, Any]], list[Malformed]]:
    """A snapshot's frames decoded, and what was malformed among them (each skipped alone)."""
    messages: list[dict[str, Any]] = []
    malformed: list[Malformed] = []
    for frame in frames:
        try:
            messages.append(decode(frame))
        except ProtocolError as exc:
            malformed.append((exc, None))
    return messages, malformed


def reachable(address: str, connected_to: str) -> str:
    """``address`` as this receiver can reach it: a relay bound on every interface
    (``tcp://0.0.0.0:P``) advertises that, so the host it was reached at stands in."""
    host, _, port = address[len("tcp://"):].rpartition(":")
    if address.startswith("tcp://") and host in ("0.0.0.0", "*", "[::]") and connected_to.startswith("tcp://"):
        return f"{connected_to.rpartition(':')[0]}:{port}"
    return address


@dataclass
class _Sender:
    """Per (run, rank): whether its live messages are applied yet, and what waits meanwhile."""

    first_seen: float
    live: bool = False
    buffer: list[dict[str, Any]] = field(default_factory=list)
    dealer: zmq.Socket | None = None
    requested_at: float | None = None
    #: Heard from ``seq`` 0 on, but only messages a relay may have forwarded late so far: the last
    #: ``seq`` of them (None once a message proved it is heard live, in order).
    provisional: int | None = None
    #: Joined by a snapshot up to this ``seq``, and no later message heard yet: a live message
    #: numbered up to it is one the snapshot held (None from the first later one on).
    joined_at: int | None = None

    def held_by_snapshot(self, message: Mapping[str, Any]) -> bool:
        """Whether a live ``message`` is one this sender's snapshot held. The snapshot comes on its
        own connection, so a frame published before it was served can reach the SUB socket after
        it (or wait there beyond one drain's batch): numbered up to the snapshot's ``seq``, it is
        dropped. The stream is in order, so the first later message ends the check; so does a
        ``run_start``, a sender restarted under the same run and rank (numbering from 0 again)."""
        joined_at = self.joined_at
        if joined_at is None:
            return False
        if message["seq"] <= joined_at and message["type"] != "run_start":
            return True
        self.joined_at = None
        return False


@dataclass
class _Endpoint:
    """An explicit endpoint's connection state, from the socket monitor."""

    connected: bool = False
    since: float = 0.0


class Receiver:
    """One SUB socket and its snapshot clients, feeding ``sink``: every socket here is created,
    used and closed by the thread that calls :meth:`run`.

    With ``endpoints`` it connects to those; without, to every live run in the registry folder
    ``registry_dir``, rescanned every :data:`REGISTRY_SCAN_S` for new ones. ``run`` keeps only that
    run's messages. ``waiting_hint`` is what the "no runs yet" notice suggests.
    """

    def __init__(
        self,
        sink: Sink,
        context: zmq.Context,
        *,
        endpoints: Sequence[str] = (),
        registry_dir: Path | None = None,
        run: str | None = None,
        waiting_hint: str = WAITING_HINT,
        subscriptions: Subscriptions | None = None,
        keys: JobKeys | None = None,
        explicit_keys: bool = False,
    ) -> None:
        self.sink = sink
        self.keys, self.explicit_keys = keys, explicit_keys
        self.context = context
        self.wanted_run = run
        self.registry_dir = registry_dir
        self.waiting_hint = waiting_hint
        self.heard = False  # any frame received yet
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        self.subscriptions = subscriptions or Subscriptions()
        self.topics = {b""}
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.monitor = self.sub.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | HANDSHAKE_FAILURES
        )
        self.poller = zmq.Poller()
        self.poller.register(self.sub, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.senders: dict[tuple[str, int], _Sender] = {}
        #: The relay asked for the job's state (once, a late joiner through a relay): its DEALER
        #: and when it was asked; "done" once answered or given up.
        self.job_state: tuple[zmq.Socket, float] | str | None = None
        self.dealers: dict[zmq.Socket, tuple[str, int]] = {}
        started = time.monotonic()
        self.endpoints = {endpoint: _Endpoint(since=started) for endpoint in endpoints}
        self.registered: dict[str, Any] = {}  # registry file path -> entry
        self.snapshot_addresses: dict[tuple[str, int], str] = {}
        self.next_scan = 0.0
        self.next_status = 0.0

    def run(self, stop: threading.Event) -> None:
        """Receive until ``stop`` is set, then close every socket. Raises ``zmq.ZMQError`` only
        when an explicit endpoint cannot even be connected to (e.g. an ipc path that is too long);
        everything after that is reported as a notice and survived."""
        try:
            # CURVE is a property of the socket: it joins with the job's keys when any address
            # needs them (beyond loopback, or keys named explicitly).
            joining = [keys for endpoint in self.endpoints if (keys := self.joining_keys(endpoint))]
            if joining:
                joining[0].join(self.sub)
            for endpoint in self.endpoints:
                self.sub.connect(endpoint)
            while not stop.is_set():
                try:
                    self.step()
                except Exception as exc:  # keep receiving whatever happens; say what went wrong
                    self.sink.tell(Notice("receiver-error", f"receiver error: {exc!r}", ttl_s=10.0))
                    time.sleep(0.5)
        finally:
            for dealer in self.dealers:
                dealer.close(linger=0)
            self.sub.disable_monitor()
            self.monitor.close(linger=0)
            self.sub.close(linger=0)

    def joining_keys(self, endpoint: str) -> JobKeys | None:
        return client_keys(endpoint, self.keys, explicit=self.explicit_keys)

    def step(self) -> None:
        now = time.monotonic()
        if not self.endpoints and now >= self.next_scan:
            self.scan_registry()
            self.next_scan = now + REGISTRY_SCAN_S
        ready = dict(self.poller.poll(_POLL_MS))
        if self.sub in ready:
            self.drain()
        self.apply_topics()  # a focus asked for from another thread
        if self.monitor in ready:
            self.read_monitor()
        for dealer in [socket for socket in ready if socket in self.dealers]:
            self.read_snapshot(dealer)
        if isinstance(self.job_state, tuple) and (
            self.job_state[0] in ready or time.monotonic() - self.job_state[1] > SNAPSHOT_TIMEOUT_S
        ):
            self.read_job_state(self.job_state[0])
        now = time.monotonic()
        self.expire_waits(now)
        if now >= self.next_status:
            self.publish_status(now)
            self.next_status = now + _STATUS_EVERY_S

    # ------------------------------------------------------------------------------- live frames

    def drain(self) -> None:
        frames = []
        recv = self.sub.recv
        for _ in range(BATCH_FRAMES):
            try:
                frames.append(recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        self.heard = self.heard or bool(frames)
        ready: list[dict[str, Any]] = []
        malformed: list[Malformed] = []
        wanted_run = self.wanted_run
        for frame in frames:
            try:
                message = decode(frame)
            except ProtocolError as exc:
                malformed.append((exc, None))
                continue
            if wanted_run is not None and message["run"] != wanted_run:
                continue
            self.subscriptions.heard(message["type"], message["run"])
            if message["type"] == "relay" and self.job_state is None:
                self.ask_relay_for_the_job(message)
            if not numbered_by_sender(message):  # a relay's: no sender stream to join
                ready.append(message)
                continue
            key = (message["run"], message["rank"])
            sender = self.senders.get(key)
            if sender is None:
                sender = self.senders[key] = self.new_sender(key, message)
            elif sender.provisional is not None:
                self.check_start(key, sender, message)
            if sender.live:
                if not sender.held_by_snapshot(message):
                    ready.append(message)
                continue
            sender.buffer.append(message)
            if sender.requested_at is None and message["type"] == "heartbeat":
                address = message.get("snapshot")
                if isinstance(address, str):
                    self.request_snapshot(key, sender, address)
            if len(sender.buffer) > BUFFER_LIMIT:
                self.go_live(key, sender, "too much traffic while waiting for the snapshot")
        self.sink.deliver(Batch(ready, received=len(frames), malformed=malformed, complete=self.whole))
        self.apply_topics()

    @property
    def whole(self) -> bool:
        """Whether every sender's stream reaches us whole, so that a jump in ``seq`` is a loss.
        Through a relay none does: the job's topics leave out most ranks' metrics, and even the
        focused rank's stream changes topics mid-way (each focus travels up the tree while its
        messages come down), so a jump there is the filter's, not a loss."""
        return not self.subscriptions.job

    def apply_topics(self) -> None:
        """Hold the topics :attr:`subscriptions` asks for now (ZeroMQ passes the change upstream)."""
        wanted = self.subscriptions.take_change()
        if wanted is None:
            return
        for topic in wanted - self.topics:
            self.sub.subscribe(topic)
        for topic in self.topics - wanted:
            self.sub.unsubscribe(topic)
        self.topics = wanted
        if self.subscriptions.job:
            self.stop_joining_unfocused()

    def stop_joining_unfocused(self) -> None:
        """Through a relay, ranks out of focus are not joined by snapshot: what waited for one is
        applied as a filtered stream (its ``seq`` jumps are the filter's, not losses)."""
        for key, sender in self.senders.items():
            if sender.live or self.subscriptions.focused(*key):
                continue
            self.close_dealer(sender)
            self.sink.deliver(Batch(sender.buffer, received=0, complete=False))
            sender.buffer = []
            sender.live = True

    def new_sender(self, key: tuple[str, int], first: dict[str, Any]) -> _Sender:
        """A sender heard for the first time: live at once if we saw its start, else snapshot first."""
        sender = _Sender(first_seen=time.monotonic())
        if self.subscriptions.job and not self.subscriptions.focused(*key):
            # Through a relay only the focused rank's history is asked for: the others are
            # summarised, and their snapshot sockets are on their own nodes.
            sender.live = True
        elif first["seq"] == 0:
            sender.live = True
            if first["type"] in snapshot_client.CAUGHT_UP_TYPES:
                sender.provisional = 0  # its start, or a relay's late copy of it: the next messages tell
        elif address := self.snapshot_addresses.get(key):
            self.request_snapshot(key, sender, address)
        return sender

    def check_start(self, key: tuple[str, int], sender: _Sender, message: dict[str, Any]) -> None:
        """Whether a sender first heard at ``seq`` 0 was in fact joined late, as ``message`` (its
        next) says; if so it is no longer live. A node relay that found a rank after its start
        forwards what it missed, its ``run_start`` first, after the rank's later messages
        (tuimon/relay/catchup.py): a jump in ``seq`` while only such messages were heard means
        they were those late copies, so the sender is joined by snapshot after all (only they were
        applied: the snapshot repeats them). A message of another kind, in order, proves it is
        heard live."""
        last, seq = sender.provisional, message["seq"]
        assert last is not None
        in_order = seq == last + 1
        sender.provisional = seq if in_order and message["type"] in snapshot_client.CAUGHT_UP_TYPES else None
        if in_order or (self.subscriptions.job and not self.subscriptions.focused(*key)):
            return
        sender.live, sender.first_seen = False, time.monotonic()
        if address := self.snapshot_addresses.get(key):
            self.request_snapshot(key, sender, address)

    # --------------------------------------------------------------------------------- snapshots

    def ask_for_snapshot(self, address: str) -> zmq.Socket:
        """A DEALER that has sent the snapshot request to ``address`` (with the job's keys where
        they are needed), registered for its reply; ZMQError if it could not be asked."""
        dealer = snapshot_client.ask(self.context, address, self.joining_keys(address))
        self.poller.register(dealer, zmq.POLLIN)
        return dealer

    def request_snapshot(self, key: tuple[str, int], sender: _Sender, address: str) -> None:
        sender.requested_at = time.monotonic()
        try:
            dealer = self.ask_for_snapshot(address)
        except zmq.ZMQError as exc:
            self.go_live(key, sender, f"cannot ask {address} for a snapshot ({exc})")
            return
        sender.dealer = dealer
        self.dealers[dealer] = key

    def read_snapshot(self, dealer: zmq.Socket) -> None:
        key = self.dealers[dealer]
        sender = self.senders[key]
        frames = dealer.recv_multipart(zmq.NOBLOCK)
        self.close_dealer(sender)
        try:
            seq, kept = snapshot_client.read_reply(frames)
        except ValueError as exc:
            error = ProtocolError(f"snapshot reply: {exc}", "bad snapshot")
            self.sink.deliver(Batch((), received=1, malformed=[(error, None)]))
            self.go_live(key, sender, "the snapshot reply was malformed")
            return
        messages, malformed = decode_all(kept)
        snapshot = Snapshot(key[0], key[1], seq, size=len(messages))
        messages += [message for message in sender.buffer if message["seq"] > seq]  # the splice
        self.sink.deliver(Batch(messages, received=len(frames) - 1, malformed=malformed, complete=self.whole,
                                snapshot=snapshot))
        sender.buffer = []
        sender.live = True
        sender.joined_at = seq

    def ask_relay_for_the_job(self, beat: Mapping[str, Any]) -> None:
        """A relay's beat: when it is the relay this receiver connected to (or the top of the tree),
        ask it for the job's state, which a late joiner missed (``tuimon/relay/history.py``)."""
        address = beat.get("snapshot")
        ours = beat.get("listen") in self.endpoints or beat.get("upstream") is None
        if not ours or not isinstance(address, str) or not self.endpoints:
            return
        try:
            self.job_state = (self.ask_for_snapshot(reachable(address, next(iter(self.endpoints)))),
                              time.monotonic())
        except zmq.ZMQError:
            self.job_state = "done"

    def read_job_state(self, dealer: zmq.Socket) -> None:
        """The relay's answer (or its silence): every message as from a filtered stream."""
        frames = dealer.recv_multipart(zmq.NOBLOCK) if dealer.poll(0) else []
        self.poller.unregister(dealer)
        dealer.close(linger=0)
        self.job_state = "done"
        if not frames:
            self.sink.tell(Notice("job-state", "the relay did not send the job's state: what happened "
                                  "before joining is missing", ttl_s=15.0))
            return
        messages, malformed = decode_all(frames[1:])
        self.sink.deliver(Batch(messages, received=0, malformed=malformed, complete=False))

    def close_dealer(self, sender: _Sender) -> None:
        if sender.dealer is not None:
            self.poller.unregister(sender.dealer)
            del self.dealers[sender.dealer]
            sender.dealer.close(linger=0)
            sender.dealer = None

    def go_live(self, key: tuple[str, int], sender: _Sender, why: str) -> None:
        """Give up on the snapshot: apply what was buffered and carry on with live messages."""
        self.close_dealer(sender)
        self.sink.deliver(Batch(sender.buffer, received=0, complete=self.whole))  # counted when they arrived
        sender.buffer = []
        sender.live = True
        run, rank = key
        self.sink.tell(Notice(
            f"snapshot:{run}:{rank}",
            f"run {run} rank {rank}: {why}; history before joining is missing",
            ttl_s=15.0,
        ))

    def expire_waits(self, now: float) -> None:
        for key, sender in self.senders.items():
            if sender.live:
                continue
            if sender.requested_at is not None and now - sender.requested_at > SNAPSHOT_TIMEOUT_S:
                self.go_live(key, sender, f"no snapshot reply within {SNAPSHOT_TIMEOUT_S:g} s")
            elif sender.requested_at is None and now - sender.first_seen > HEARTBEAT_WAIT_S:
                self.go_live(key, sender, f"no heartbeat within {HEARTBEAT_WAIT_S:g} s")

    # ------------------------------------------------------------------------- discovery, health

    def scan_registry(self) -> None:
        entries = {str(entry.path): entry for entry in live_entries(self.registry_dir)}
        wanted = self.wanted_run
        for path, entry in entries.items():
            if path in self.registered or (wanted is not None and entry.run != wanted):
                continue
            try:
                self.sub.connect(entry.pub)
            except zmq.ZMQError as exc:
                notice = f"cannot connect to {entry.pub} ({exc})"
                self.sink.tell(Notice(f"registry:{path}", notice, ttl_s=10.0))
                continue
            self.registered[path] = entry
            if entry.snapshot:
                self.snapshot_addresses[(entry.run, entry.rank)] = entry.snapshot
        for path in [path for path in self.registered if path not in entries]:
            gone = self.registered.pop(path)
            with contextlib.suppress(zmq.ZMQError):  # already gone: ZeroMQ dropped it itself
                self.sub.disconnect(gone.pub)

    def read_monitor(self) -> None:
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            endpoint = event["endpoint"].decode(errors="replace")
            if event["event"] & HANDSHAKE_FAILURES:
                self.sink.tell(Notice(f"refused:{endpoint}", refusal(event, serving=False), ttl_s=10.0))
                continue
            state = self.endpoints.get(endpoint)
            if state is None:
                continue
            connected = event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if connected != state.connected:
                state.connected, state.since = connected, time.monotonic()

    def publish_status(self, now: float) -> None:
        sink = self.sink
        heard = self.heard
        for endpoint, state in self.endpoints.items():
            silent_for = now - state.since
            if (not state.connected or not heard) and silent_for >= SILENT_ENDPOINT_S:
                sink.tell(Notice(
                    f"endpoint:{endpoint}",
                    f"nothing heard from {endpoint} for {silent_for:.0f} s: is the training running and "
                    f"publishing there? (`tuimon watch` with no address finds the runs on this host)",
                ))
            else:
                sink.tell(Notice(f"endpoint:{endpoint}", None))
        if self.endpoints:
            detail = f"{sum(s.connected for s in self.endpoints.values())}/{len(self.endpoints)} connected"
        else:
            detail = f"{len(self.registered)} publisher(s) from the registry"
            if not self.registered and not self.senders:
                where = describe_targets(list(self.endpoints), self.registry_dir)
                sink.tell(Notice("waiting", f"{self.waiting_hint} (looking in {where})"))
            else:
                sink.tell(Notice("waiting", None))
        sink.tell(SourceStatus(kind="live", detail=detail))
