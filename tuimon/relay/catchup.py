"""A rank's start for the node relay that found it late: its snapshot, asked for once.

A node relay finds its node's publishers by scanning the run registry (every second), and a PUB
socket sends nothing to a subscriber before it is connected (ZeroMQ's slow joiner, the zguide,
chapter 5). So a rank usually sent its ``run_start`` (its command line, config, world size,
versions), and sometimes events and invariants, before its relay heard it; nobody above the node
would ever learn them. The relay therefore does what a viewer that joins late does
(docs/protocol.md, "Late joiners: snapshot"): a rank first heard past its ``seq`` 0 is asked for
its snapshot once (the address from the registry, else from its heartbeat), and what the relay
missed of it, the ``run_start``, events (their latest update), invariants and ``run_end`` numbered
before the first message it heard, joins the stream it forwards, byte for byte. Metrics and GPU
readings are not: summaries carry the latest ones, and a history of them is the rank's own to keep.

Those frames arrive after the rank's first live ones, so a rank's ``seq`` is not in order through
a relay; readers behind a relay apply its streams as filtered ones (no gaps counted) and keep the
latest update of each event, so the order does not matter to them.

A rank that does not answer within :data:`~tuimon.sources.receiver.SNAPSHOT_TIMEOUT_S` (a refused
request, an old publisher) is given up on: its live messages were forwarded all along. A rank that
restarts (its ``seq`` goes back) is a new sender, asked again if it is heard late again. Only the
node relay's main thread uses this (it owns the sockets).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from publisher.wire.curve import JobKeys
from publisher.wire.topics import subscription
from tuimon.sources import snapshot_client
from tuimon.sources.receiver import SNAPSHOT_TIMEOUT_S
from tuimon.sources.snapshot_client import CAUGHT_UP_TYPES

log = logging.getLogger(__name__)

_PREFIXES = tuple(subscription(msg_type) for msg_type in CAUGHT_UP_TYPES)
#: Seconds a rank heard late may take to say where its snapshot socket is (heartbeats are 1 s apart).
ADDRESS_WAIT_S = 5.0
#: Frames decoded and checked, each with its message, the malformed ones counted and left out.
Decoder = Callable[[Iterable[bytes]], Iterator[tuple[bytes, dict[str, Any]]]]


@dataclass
class _Sender:
    """One rank process as the relay heard it: its first and latest ``seq``, and its snapshot request."""

    first_seq: int
    last_seq: int
    heard_at: float
    dealer: zmq.Socket | None = None
    asked_at: float = 0.0
    done: bool = False


class Catchup:
    """The snapshots a node relay asks of ranks it heard late. ``keys(address)``: the CURVE keys to
    join ``address`` with (None on loopback); ``decoded``: how the relay checks frames."""

    def __init__(
        self, context: zmq.Context, keys: Callable[[str], JobKeys | None], decoded: Decoder
    ) -> None:
        self._context = context
        self._keys = keys
        self._decoded = decoded
        self._senders: dict[tuple[str, int], _Sender] = {}
        #: (run, rank) -> snapshot address, from the run registry (heartbeats say it too).
        self.addresses: dict[tuple[str, int], str] = {}
        #: Snapshots received, and ranks given up on (no address, no reply, a malformed reply).
        self.received = self.given_up = 0

    def heard(self, messages: Iterable[Mapping[str, Any]], now: float, *, asking: bool = True) -> None:
        """The ranks' messages just taken in (decoded and valid). ``asking`` False: note them but
        ask nobody yet (the relay's stream does not reach its root yet)."""
        for message in messages:
            key = (message["run"], message["rank"])
            seq = message["seq"]
            sender = self._senders.get(key)
            if sender is None or seq <= sender.last_seq:  # new, or a new process numbering from 0
                self._close(sender)
                sender = self._senders[key] = _Sender(seq, seq, now, done=seq == 0)
            sender.last_seq = seq
            if message["type"] == "run_end":
                self._close(self._senders.pop(key))
                continue
            if not asking:
                sender.heard_at = now  # its wait for an address starts once asking
                continue
            if sender.done or sender.dealer is not None:
                continue
            address = self.addresses.get(key)
            if address is None and message["type"] == "heartbeat":
                address = message.get("snapshot")
            if isinstance(address, str):
                self._ask(key, sender, address, now)

    @property
    def pending(self) -> bool:
        """Whether some rank heard late has not been asked yet (nor given up on)."""
        return any(not sender.done and sender.dealer is None for sender in self._senders.values())

    def _ask(self, key: tuple[str, int], sender: _Sender, address: str, now: float) -> None:
        try:
            sender.dealer = snapshot_client.ask(self._context, address, self._keys(address))
        except zmq.ZMQError as exc:
            log.warning("tuimon relay: cannot ask %s rank %d for its start at %s (%s)", *key, address, exc)
            self._give_up(sender)
            return
        sender.asked_at = now

    def missed(self, now: float) -> list[tuple[bytes, dict[str, Any]]]:
        """What the snapshots that came hold of the kept types, numbered before the first message
        heard from their rank, each frame with its message (checked as at the intake); ranks whose
        reply or address is overdue are given up on."""
        missed: list[tuple[bytes, dict[str, Any]]] = []
        for (run, rank), sender in self._senders.items():
            if sender.done:
                continue
            if sender.dealer is None:
                if now - sender.heard_at > ADDRESS_WAIT_S:
                    self._give_up(sender)
                continue
            if sender.dealer.poll(0):
                reply = sender.dealer.recv_multipart(zmq.NOBLOCK)
                self._close(sender)
                try:
                    _, kept = snapshot_client.read_reply(reply)
                except ValueError as exc:
                    log.warning("tuimon relay: %s rank %d sent a malformed snapshot (%s)", run, rank, exc)
                    self.given_up += 1
                    continue
                self.received += 1
                wanted = (frame for frame in kept if frame.startswith(_PREFIXES))
                missed += [
                    (frame, message)
                    for frame, message in self._decoded(wanted)
                    if (message["run"], message["rank"]) == (run, rank) and message["seq"] < sender.first_seq
                ]
            elif now - sender.asked_at > SNAPSHOT_TIMEOUT_S:
                self._give_up(sender)
        return missed

    def _give_up(self, sender: _Sender) -> None:
        self._close(sender)
        self.given_up += 1

    @staticmethod
    def _close(sender: _Sender | None) -> None:
        if sender is None:
            return
        sender.done = True
        if sender.dealer is not None:
            sender.dealer.close(linger=0)
            sender.dealer = None

    def close(self) -> None:
        for sender in self._senders.values():
            self._close(sender)
