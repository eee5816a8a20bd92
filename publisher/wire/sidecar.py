"""The publisher's own process: encoding, sending, recording, snapshots and heartbeats, out of training.

Started by :class:`~publisher.wire.sidecar_link.SidecarPublisher` (``python -m
publisher.publisher_process``, which adds the detectors that read only published metrics, as a
:class:`Watcher`), never by hand. Threads of the training process share its GIL, so a sender
thread's Python (numbering, encoding, sending, recording each message: ~30 µs a step at ~1 ms
steps on a CPU) is paid by the training thread in waits for the GIL, about as much again (issue
23, ``benchmarks/gil_share.py``).
Here the same :class:`~publisher.wire.transport.Publisher` runs in a process of its own, as W&B
moved its run's work into a separate service process (``wandb-core``); the training process hands
it the queued messages once per hand-off period, as one JSON array in one ZeroMQ frame.

The exchange, on a PAIR socket that the training process binds (ipc, in a folder only its user can
enter) and this process connects to:

- first, on standard input, one JSON line of settings (run, rank, host, endpoint, record,
  heartbeat_s, the inbox address, the training process's pid, the detectors to run here); this
  process answers on standard output with one JSON line: the bound ``endpoint`` and
  ``snapshot`` addresses, or the ``error`` the Publisher raised (its type in ``kind``), and then
  says nothing more there; its first :meth:`Publisher.stats` on the socket says that the socket
  is connected;
- then frames, each a JSON array of items: ``["m", type, step, ts, body]`` (a message to publish),
  ``["beat", fields]`` (the training process is alive: the fields of its next heartbeats),
  ``["ctx", fields]`` (what the training process told its detectors: the :class:`Watcher`'s),
  ``["drops", n]`` (messages it gave up before handing them over), ``["close", status, error,
  timeout]``; after a frame this process sends back its :meth:`Publisher.stats`, every
  :data:`STATS_S` at most, and at close.

Heartbeats go out on this process's own clock but only while beats keep coming: when the training
process stops answering (frozen, stopped, stuck with the GIL held), its heartbeats stop as they would
in-process, and viewers see it fall silent. When the training process ends without closing (killed,
crashed hard), this process notices within a second, sends ``run_end`` ``failed`` saying so, and
exits: the viewers learn that the run is over instead of waiting for silence to mean it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
import zmq

from publisher.wire.transport import Publisher

log = logging.getLogger(__name__)

#: Seconds this process waits for a frame before it looks whether the training process is alive.
POLL_S = 0.5
#: Heartbeat periods without a beat from the training process after which its heartbeats stop.
SILENT_BEATS = 2.5
#: Seconds between two reports of :meth:`Publisher.stats` to the training process (and at close).
STATS_S = 0.5


class _Relay:
    """What the training process said lately, for the Publisher's heartbeats."""

    def __init__(self, heartbeat_s: float) -> None:
        self.fields: dict[str, Any] = {}
        self.last_beat = time.monotonic()
        self._silent_after_s = SILENT_BEATS * heartbeat_s

    def heartbeat_extra(self) -> dict[str, Any] | None:
        """The fields of the training process's last beat; None (no heartbeat) once it is silent."""
        if time.monotonic() - self.last_beat > self._silent_after_s:
            return None
        return self.fields


#: Publishes one message from this process: (type, step, body).
Publish = Callable[[str, "int | None", dict[str, Any]], None]


class Watcher(Protocol):
    """What reads the messages this process publishes (the detectors that need nothing more); it
    publishes what it finds with the ``publish`` it was made with."""

    def published(self, msg_type: str, step: int | None, body: dict[str, Any]) -> None:
        """A message was published (its body as the training process queued it)."""

    def context(self, fields: dict[str, Any]) -> None:
        """The training process's ``["ctx", fields]``."""

    def close(self) -> None:
        """The run ends: say what is held back (before ``run_end``)."""


def serve(settings: dict[str, Any], answer: Any,
          watcher: Callable[[dict[str, Any], Publish], Watcher] | None = None) -> int:
    """Run one rank's publisher for the training process described by ``settings``; ``answer``
    writes the start-up line; ``watcher`` (settings, publish) makes what reads the published
    messages. Returns the exit status."""
    heartbeat_s = float(settings.get("heartbeat_s", 1.0))
    relay = _Relay(heartbeat_s)
    try:
        publisher = Publisher(settings["run"], int(settings["rank"]), host=settings.get("host"),
                              endpoint=settings.get("endpoint"), record=settings.get("record"),
                              heartbeat_s=heartbeat_s, heartbeat_extra=relay.heartbeat_extra,
                              registered_pid=int(settings["parent"]))
    except Exception as exc:  # said to the training process, which raises it where a user sees it
        answer({"error": str(exc), "kind": type(exc).__name__})
        return 1
    context = zmq.Context()
    inbox = context.socket(zmq.PAIR)
    inbox.setsockopt(zmq.LINGER, 0)
    inbox.setsockopt(zmq.SNDTIMEO, 30_000)  # a send that blocks waits for the training process this long
    inbox.connect(settings["inbox"])
    answer({"endpoint": publisher.endpoint, "snapshot": publisher.snapshot_endpoint})
    link_drops = 0

    def report(flags: int = 0) -> None:
        """Send :meth:`Publisher.stats` to the training process; one it does not take is skipped."""
        with contextlib.suppress(zmq.Again):
            inbox.send(orjson.dumps({**publisher.stats(), "link_drops": link_drops}), flags)

    # A PAIR socket sends only once connected, which ZeroMQ does in the background: this first
    # report tells the training process that the link is up (a frame it sent before would be lost);
    # not connected within SNDTIMEO, the loop looks for the parent.
    report()
    # Made once the training process may go on (its Monitor waits for the report above, not for
    # what the watcher imports); frames sent meanwhile wait in the socket.
    watching = _Guarded(watcher, settings, lambda msg_type, step, body: publisher.publish(
        msg_type, step, **body))
    parent = int(settings["parent"])
    next_stats = 0.0
    try:
        while True:
            if not inbox.poll(int(POLL_S * 1000)):
                if os.getppid() != parent:
                    publisher.close("failed", f"the training process (pid {parent}) ended without "
                                              "closing its Monitor (killed, or crashed)")
                    return 0
                continue
            for item in _items(inbox.recv()):
                kind = item[0] if isinstance(item, list) and item else None
                try:
                    if kind == "m":
                        _, msg_type, step, ts, body = item
                        publisher.publish(msg_type, step, ts=ts, **body)
                        watching.published(msg_type, step, body)
                    elif kind == "ctx":
                        watching.context(dict(item[1]))
                    elif kind == "beat":
                        relay.fields, relay.last_beat = dict(item[1]), time.monotonic()
                    elif kind == "drops":
                        link_drops += int(item[1])
                        for _ in range(int(item[1])):
                            publisher.count_drop()
                    elif kind == "close":
                        _, status, error, timeout = item
                        watching.close()
                        publisher.close(status, error, timeout)
                        report()
                        return 0
                    else:
                        raise ValueError(f"not an item: {item!r:.80}")
                except (TypeError, ValueError):  # counted and skipped alone
                    publisher.count_drop()
            if time.monotonic() >= next_stats:  # the training process reads these when it can
                next_stats = time.monotonic() + STATS_S
                report(zmq.NOBLOCK)
    finally:
        inbox.close(linger=0)
        context.term()


def _items(frame: bytes) -> list[Any]:
    """A frame's items; a frame that is not a JSON array holds none (the training process makes
    every frame, so one is a bug there, not here)."""
    try:
        items = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return []
    return items if isinstance(items, list) else []


class _Guarded:
    """The :class:`Watcher` that ``make`` makes (or none), whose failures are logged once and end
    its watching: a bug in what reads the messages must not stop publishing them. A ``ctx`` item
    it cannot read (TypeError, ValueError) is counted and skipped as any bad item; a published
    message it cannot read is skipped alone by the watcher (it went out: the readers, which check
    every message, refuse and count it), the first such logged."""

    def __init__(self, make: Callable[[dict[str, Any], Publish], Watcher] | None,
                 settings: dict[str, Any], publish: Publish) -> None:
        self._watcher: Watcher | None = None
        self._unread = 0  # published messages the watcher could not read
        if make is not None:
            try:
                self._watcher = make(settings, publish)
            except Exception:
                self._failed()

    def published(self, msg_type: str, step: int | None, body: dict[str, Any]) -> None:
        watcher = self._watcher
        if watcher is None:
            return
        try:
            self._call(lambda: watcher.published(msg_type, step, body), bad_item=True)
        except (TypeError, ValueError) as exc:
            self._unread += 1
            if self._unread == 1:
                log.warning("tuimon: the publisher's process could not read a %s message (step %s) and "
                            "goes on without it: %s", msg_type, step, exc)

    def context(self, fields: dict[str, Any]) -> None:
        watcher = self._watcher
        if watcher is not None:
            self._call(lambda: watcher.context(fields), bad_item=True)

    def close(self) -> None:
        if self._watcher is not None:
            self._call(self._watcher.close)

    def _call(self, action: Callable[[], None], bad_item: bool = False) -> None:
        try:
            action()
        except (TypeError, ValueError):
            if bad_item:
                raise
            self._failed()
        except Exception:
            self._failed()

    def _failed(self) -> None:
        log.exception("tuimon: the publisher's process stopped watching the messages it publishes")
        self._watcher = None
