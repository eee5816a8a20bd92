"""The publisher: takes messages from the training process and puts them on the wire, off its hot path.

``publish()`` is the only part that runs on the training thread: it stamps the time and appends
to a bounded queue, a few hundred nanoseconds, and never waits for anything. One sender thread
owns everything slow: numbering, encoding, the ZeroMQ sockets (used only by that thread, as
ZeroMQ requires), the recording, the snapshot history and the heartbeat.

Losing messages is preferred to slowing training, and every loss is visible:

- the queue is full (the sender cannot keep up): the message is dropped and counted in
  ``heartbeat.stats.dropped``;
- a viewer falls behind (it is frozen, suspended with Ctrl-Z, or on a slow link): once its
  high-water mark is reached, ZeroMQ's PUB socket drops the messages *for that viewer only*, and
  that viewer sees the loss as gaps in ``seq``. The publisher deliberately does not set
  ``XPUB_NODROP``: with it, ZeroMQ refuses a message for *every* viewer as soon as *one* is full,
  so a single suspended viewer would blank every other viewer of the run, heartbeats included.

The recording and the snapshot history receive every numbered message whether or not any viewer
got it, so a recording is complete even while nobody watches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import zmq

from publisher.wire import registry, run_summary, snapshot_gate
from publisher.wire.curve import (
    HANDSHAKE_FAILURES,
    Guard,
    JobKeys,
    beyond_loopback,
    insecure_allowed,
    load_keys,
    refusal,
    server_keys,
)
from publisher.wire.history import SnapshotHistory
from publisher.wire.hostname import host_name, machine_name
from publisher.wire.protocol import (
    ENVELOPE_FIELDS,
    MESSAGE_TYPES,
    decode,
    encode_fitted,
    make_message,
)
from publisher.wire.recorder import Recorder
from publisher.wire.run_end import EndOnce, end_status, end_status_at_exit
from publisher.wire.validation import MAX_NAME_CHARS

log = logging.getLogger(__name__)

#: Loopback only: a run is visible from other machines only when the user asks for it.
DEFAULT_ENDPOINT = "tcp://127.0.0.1:*"
_ENDPOINT_EXAMPLES = (
    "tcp://127.0.0.1:* (any free port, this machine only) or tcp://0.0.0.0:5555 (all interfaces)"
)

#: How often the Monitor's background threads hand work on: the step worker publishes the steps
#: queued since its last turn, and the idle sender wakes to send them (so a metric reaches a viewer
#: at most twice this late, and a snapshot request waits at most this long; a heartbeat is never
#: late: the sleep ends at its time; close() wakes both at once). Each wake costs CPU (90-210 µs a
#: sleep in the sandboxed kernel measured) and each batch refills caches the training step evicted:
#: at 50 ms the worker's and the sender's CPU per step were 25-50 % higher than at 100 ms on the
#: three models of benchmarks/cost_split.py (alternating runs, docs/benchmarks.md), and 200 ms saved
#: little more.
HANDOFF_S = 0.1
#: Messages sent between two looks at the snapshot socket, so a burst cannot starve late joiners.
_BATCH = 1_000
#: How long closing may wait to deliver the last messages (run_end) to viewers that are reading.
_LINGER_MS = 200

_QueuedMessage = tuple[str, int | None, float, dict[str, Any]]  # (type, step, ts, body)
#: Fields a heartbeat's extra fields may not set: the envelope's and the heartbeat's own.
_HEARTBEAT_OWN = frozenset({*ENVELOPE_FIELDS, "step", "snapshot", "stats"})


def _name(what: str, value: str) -> str:
    """A run or host name readers accept (1 to 256 characters), else a ValueError at start-up."""
    if not (isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS):
        raise ValueError(f"{what} must be a name of 1 to {MAX_NAME_CHARS} characters, got {repr(value)[:80]}")
    return value


def _snapshot_address(pub_endpoint: str) -> str:
    """Where to bind the snapshot socket: the PUB's interface with a free port (tcp), or beside it."""
    if pub_endpoint.startswith("tcp://"):
        return pub_endpoint.rpartition(":")[0] + ":*"
    return pub_endpoint + ".snapshot"


class Publisher:
    """One rank's stream: PUB socket, snapshot ROUTER socket, recording and registry entry.

    Binding happens here, in the constructor, so that a wrong address or an unwritable recording
    path fails at start-up with a clear message rather than silently later::

        with Publisher("llama-7b", rank=0, record="runs/llama.jsonl") as publisher:
            publisher.publish("run_start", config=config, seed=0, world_size=1)
            publisher.publish("metrics", step=step, metrics=wire_numbers({"loss": loss}))

    ``close()`` (or leaving the ``with`` block, or interpreter exit) sends ``run_end``: do not
    publish one yourself.

    ``heartbeat_extra``: called on the sender thread before each heartbeat, returns fields to add
    to it (JSON-safe, small: the heartbeat's 16 KiB bound holds); how the layers above say
    something every second without a thread of their own (the hang watchdog's ``stalled_s`` and
    ``stack``). It must not block. Fields it returns that the heartbeat already has are ignored;
    if it raises, or its fields make the heartbeat unsendable, the heartbeat goes without them
    and :attr:`heartbeat_extra_failures` counts it (the first is logged); if it returns None, no
    heartbeat goes this time (the process it speaks for has stopped answering: a publisher in a
    process of its own, :mod:`publisher.wire.sidecar`, is as silent as a frozen one in-process).
    ``registered_pid``: the process the registry entry names (default this one; the training
    process, for a publisher that runs in a process of its own).
    """

    def __init__(
        self,
        run: str,
        rank: int = 0,
        *,
        host: str | None = None,
        endpoint: str | None = None,
        record: str | os.PathLike[str] | None = None,
        hwm: int = 10_000,
        queue_max: int = 100_000,
        history_metrics: int = 10_000,
        heartbeat_s: float = 1.0,
        register: bool = True,
        heartbeat_extra: Callable[[], Mapping[str, Any] | None] | None = None,
        keys: JobKeys | None = None,
        insecure: bool | None = None,
        registered_pid: int | None = None,
    ) -> None:
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be positive, got {heartbeat_s!r}")
        self.run = _name("run", run)
        self.rank = rank
        # $TUIMON_HOST, checked here so that a bad value stops the start, not every viewer later.
        self.host = _name("host", host or host_name())
        self._queue: deque[_QueuedMessage] = deque()
        self._queue_max = queue_max
        self._heartbeat_s = heartbeat_s
        self._heartbeat_extra = heartbeat_extra
        self._extra_failures = 0
        # CURVE (publisher/wire/curve.py) for an endpoint beyond loopback: the job's keys (None:
        # $TUIMON_KEYS or the default file), or ``insecure`` (None: $TUIMON_INSECURE).
        self._keys, self._insecure = keys, insecure
        self._guard: Guard | None = None
        self._refusals: list[zmq.Socket] = []  # handshake-failure monitors of the CURVE sockets
        self._refused = 0
        self._history = SnapshotHistory(max_metrics=history_metrics)
        self._started = time.time()
        self._registered_pid = os.getpid() if registered_pid is None else registered_pid

        # Written by publishing threads (under the lock: drops only, the fast path takes none).
        self._drop_lock = threading.Lock()
        self._queue_dropped = 0
        # Written by the sender thread only; read by stats() from any thread.
        self._seq = 0
        self._sent = 0
        self._send_dropped = 0
        self._recorded = 0
        self._gate = snapshot_gate.SnapshotGate()
        self._last_step: int | None = None
        self._warned: set[tuple[str, type]] = set()

        # Closing: close() fills these in, then sets _stop (which publishes them to the sender).
        self._closed = False
        self._stop = threading.Event()
        self._stop_deadline = 0.0
        self._end_body: dict[str, Any] = {}

        # An own context: terminating it on close cannot disturb ZeroMQ use elsewhere in the process.
        self._context = zmq.Context()
        try:
            self._pub, self._router = self._bind(DEFAULT_ENDPOINT if endpoint is None else endpoint, hwm)
            self._recorder = None if record is None else Recorder(record)
            self._record_path = None if self._recorder is None else os.path.abspath(self._recorder.path)
        except BaseException:
            self._close_guard()
            self._context.destroy(linger=0)
            raise
        # Thread start is a memory barrier: from here on only the sender thread touches the sockets.
        self._thread = threading.Thread(
            target=self._run_sender, name=f"tuimon-publisher-{rank}", daemon=True
        )
        self._thread.start()
        self._registry_path = self._register() if register else None
        self._summary = self._account_path()
        self._account(ended=False)
        self._end_once = EndOnce(self._close_at_exit)

    def _account_path(self) -> Path | None:
        """Where this rank's account of its run goes (:mod:`publisher.wire.run_summary`), if anywhere."""
        folder = os.environ.get(run_summary.SUMMARY_DIR_ENV)
        return None if not folder else run_summary.summary_path(folder, self.rank, self._registered_pid)

    def _account(self, *, ended: bool) -> None:
        """Write this rank's account for ``tuimon run``; a failure costs the account only."""
        if self._summary is None:
            return
        try:
            events = [decode(frame) for frame in self._history.event_frames()] if ended else []
            run_summary.write_summary(self._summary, run_summary.account(
                run=self.run, rank=self.rank, host=self.host, pid=self._registered_pid, ended=ended,
                last_step=self._last_step, status=self._end_body.get("status"),
                error=self._end_body.get("error"), recording=self._record_path, events=events,
            ))
        except Exception as exc:
            log.warning("tuimon: could not write the run's account to %s: %s", self._summary, exc)

    def _bind(self, endpoint: str, hwm: int) -> tuple[zmq.Socket, zmq.Socket]:
        """Bind PUB on ``endpoint`` and the snapshot ROUTER on the same interface; ValueError if not."""
        if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(
                f"cannot publish on {endpoint!r}: not a tcp:// or ipc:// address; "
                f"use an address such as {_ENDPOINT_EXAMPLES}"
            )
        pub = self._context.socket(zmq.PUB)
        pub.sndhwm = hwm
        pub.linger = _LINGER_MS
        router = snapshot_gate.snapshot_socket(self._context)
        if "[" in endpoint:  # an IPv6 literal such as tcp://[::1]:*
            pub.ipv6 = router.ipv6 = True
        insecure = insecure_allowed() if self._insecure is None else self._insecure
        if beyond_loopback(endpoint) and not insecure:  # CURVE, or a clear refusal (docs/protocol.md)
            serve = server_keys(endpoint, self._keys or load_keys(), insecure=False,
                                what=f"run {self.run!r} publishing")
            assert serve is not None
            self._guard = Guard(self._context, serve)
            for sock in (pub, router):
                serve.serve(sock)
                self._refusals.append(sock.get_monitor_socket(HANDSHAKE_FAILURES))
        try:
            pub.bind(endpoint)
            self._endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            router.bind(_snapshot_address(self._endpoint))
            self._snapshot_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            raise ValueError(
                f"cannot publish on {endpoint!r}: {exc.strerror}; "
                f"use an address such as {_ENDPOINT_EXAMPLES}"
            ) from None
        if beyond_loopback(self._endpoint) and insecure:
            log.warning(
                "tuimon: run %r publishes on %s, beyond this machine, without CURVE (insecure): anyone "
                "who can reach it can read its metrics, events, config, argv and working directory, and "
                "send to its snapshot socket. Use CURVE keys (`tuimon keys`) or bind to 127.0.0.1 unless "
                "that is what you want.",
                self.run, self._endpoint,
            )
        return pub, router

    def _register(self) -> Path | None:
        """Announce the run to viewers on this node. A broken runtime folder must not stop training."""
        record = self._record_path
        try:
            return registry.register(
                run=self.run,
                rank=self.rank,
                host=self.host,
                machine=machine_name(),
                pid=self._registered_pid,
                pub=self._endpoint,
                snapshot=self._snapshot_endpoint,
                record=record,
                started=self._started,
            )
        except OSError as exc:
            log.warning(
                "tuimon: run %r is not discoverable (%s); viewers need its address %s",
                self.run, exc, self._endpoint,
            )
            return None

    @property
    def endpoint(self) -> str:
        """The PUB address actually bound, e.g. ``tcp://127.0.0.1:54321``."""
        return self._endpoint

    @property
    def snapshot_endpoint(self) -> str:
        """The snapshot ROUTER address (also in every heartbeat and in the registry entry)."""
        return self._snapshot_endpoint

    @property
    def heartbeat_extra_failures(self) -> int:
        """Heartbeats sent without the ``heartbeat_extra`` fields because it failed or they did not fit."""
        return self._extra_failures

    @property
    def bad_requests(self) -> int:
        """Frames on the snapshot socket that were not snapshot requests (ignored)."""
        return self._gate.bad

    def stats(self) -> dict[str, int]:
        """Counts since start: ``sent``, ``dropped`` (never sent), ``queued``, ``recorded`` lines;
        on the snapshot socket, ``snapshots`` served, ``snapshots_refused`` (over a rate limit) and
        ``bad_requests`` (frames that were not requests); ``refused``: connections that failed
        the CURVE handshake (an endpoint beyond loopback)."""
        return {
            "sent": self._sent,
            "dropped": self._queue_dropped + self._send_dropped,
            "queued": len(self._queue),
            "recorded": self._recorded,
            "snapshots": self._gate.served,
            "snapshots_refused": self._gate.refused,
            "bad_requests": self._gate.bad,
            "refused": self._refused,
        }

    def count_drop(self) -> None:
        """Count one message its producer gave up before publishing it (its own queue was full):
        it shows in ``stats()["dropped"]`` and the heartbeat like one this queue refused."""
        with self._drop_lock:
            self._queue_dropped += 1

    def publish(self, msg_type: str, step: int | None = None, *, ts: float | None = None,
                **body: Any) -> None:
        """Queue one message; thread-safe, never blocks. Drops (and counts) it if the queue is full.

        ``body`` must be JSON-safe with non-finite numbers already in wire form
        (``protocol.wire_numbers``), and must not be mutated afterwards: it is encoded later, on
        the sender thread. The envelope (run, rank, host, seq) is added there too; ``ts``, when
        the message was made (default: now; the training process's time where this publisher
        runs in a process of its own, :mod:`publisher.wire.sidecar`).
        """
        if msg_type not in MESSAGE_TYPES:
            raise ValueError(f"unknown message type {msg_type!r}; expected one of {sorted(MESSAGE_TYPES)}")
        if self._closed or len(self._queue) >= self._queue_max:
            self.count_drop()
            return
        self._queue.append((msg_type, step, time.time() if ts is None else ts, body))

    # --- sender thread -------------------------------------------------------------------------

    def _run_sender(self) -> None:
        try:
            self._send_until_stopped()
            dropped_at_close = len(self._queue)
            self._queue.clear()
            self._send_dropped += dropped_at_close
            self._emit("run_end", self._last_step, time.time(), self._end_body)
            self._account(ended=True)
        except Exception:
            log.exception("tuimon: the publisher's sender thread failed; monitoring stops, training goes on")
        finally:
            self._closed = True
            if self._recorder is not None:
                try:
                    self._recorder.close()
                except OSError as exc:
                    self._recording_failed(self._recorder, exc)
            self._pub.close()
            self._router.close()
            self._close_guard()

    def _send_until_stopped(self) -> None:
        """Send what is queued, serve snapshots on their schedule, beat; after close(), drain until
        empty or timeout. Sleeps on the stop event only (close() ends the sleep at once); the
        snapshot socket is looked at without waiting, when its schedule allows."""
        queue = self._queue
        now = time.monotonic()
        next_heartbeat = now + self._heartbeat_s
        next_serve = now
        timeout_s = 0.0
        while True:
            if timeout_s:
                self._stop.wait(timeout_s)
                now = time.monotonic()
            # Under a flood of requests the socket is not looked at again before next_serve, so
            # the loop cannot spin on it.
            request_waiting = now >= next_serve and bool(self._router.poll(0, zmq.POLLIN))
            # Send what was queued before serving a snapshot, so the snapshot includes it.
            for _ in range(min(len(queue), _BATCH)):
                self._emit(*queue.popleft())
            if request_waiting:
                self._serve_snapshots()
                next_serve = time.monotonic() + snapshot_gate.SERVE_INTERVAL_S
            now = time.monotonic()
            if self._stop.is_set() and (not queue or now >= self._stop_deadline):
                return
            if now >= next_heartbeat:
                self._emit_heartbeat()
                next_heartbeat = now + self._heartbeat_s
            if self._recorder is not None:
                try:
                    self._recorder.flush_if_due()
                except OSError as exc:
                    self._recording_failed(self._recorder, exc)
            timeout_s = 0.0 if queue else min(HANDOFF_S, max(0.0, next_heartbeat - now))

    def _emit(self, msg_type: str, step: int | None, ts: float, body: dict[str, Any]) -> bool:
        """Number, encode once, send, record and remember one message; False if it could not be
        encoded (it is then counted as dropped and not numbered)."""
        if step is not None and (self._last_step is None or step > self._last_step):
            self._last_step = step
        try:
            message = make_message(
                msg_type, run=self.run, rank=self.rank, host=self.host, ts=ts, seq=self._seq, step=step,
                **body,
            )
            frame = encode_fitted(message)
        except (TypeError, ValueError) as exc:
            # A bug in the caller (a tensor in the body, a NaN not in wire form): lose this message,
            # say so once per kind of mistake, keep the stream going.
            self._send_dropped += 1
            self._warn_once(msg_type, exc)
            return False
        self._seq += 1
        try:
            self._pub.send(frame, zmq.NOBLOCK)
            self._sent += 1
        except zmq.ZMQError as exc:  # not a slow viewer (PUB drops for those by itself): a broken socket
            self._send_dropped += 1
            self._warn_once(msg_type, exc)
        if self._recorder is not None:
            try:
                self._recorder.append(frame)
                self._recorded += 1
            except OSError as exc:
                self._recording_failed(self._recorder, exc)
        self._history.add(message, frame)
        return True

    def _emit_heartbeat(self) -> None:
        self._count_refusals()
        extra = self._heartbeat_fields()
        if extra is None:
            return  # heartbeat_extra says the process it speaks for is not answering: no heartbeat
        body: dict[str, Any] = {"snapshot": self._snapshot_endpoint, "stats": self.stats()}
        if extra:
            if self._emit("heartbeat", self._last_step, time.time(), {**body, **extra}):
                return
            self._extra_failed(ValueError("its fields do not fit a heartbeat"))
            body["stats"] = self.stats()  # the refused heartbeat is counted as dropped
        self._emit("heartbeat", self._last_step, time.time(), body)

    def _count_refusals(self) -> None:
        """Peers the CURVE handshake refused since the last heartbeat: counted, and said once."""
        if not self._refusals:
            return
        # Imported here, with CURVE only: the module imports zmq.asyncio and asyncio, a third of
        # the publisher's process's start-up (30 of ~100 ms, python -X importtime).
        from zmq.utils.monitor import parse_monitor_message

        for monitor in self._refusals:
            while True:
                try:
                    event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if not self._refused:
                    text = refusal(event, serving=True)
                    log.warning("tuimon: %s", text)
                self._refused += 1

    def _close_guard(self) -> None:
        for monitor in self._refusals:
            monitor.close(linger=0)
        if self._guard is not None:
            self._guard.stop()

    def _heartbeat_fields(self) -> dict[str, Any] | None:
        """The ``heartbeat_extra`` fields, without any the heartbeat sets itself; {} if it fails,
        None if it says that no heartbeat is to go now."""
        if self._heartbeat_extra is None:
            return {}
        try:
            extra = self._heartbeat_extra()
            if extra is None:
                return None
            return {key: value for key, value in extra.items() if key not in _HEARTBEAT_OWN}
        except Exception as exc:
            self._extra_failed(exc)
            return {}

    def _extra_failed(self, exc: Exception) -> None:
        self._extra_failures += 1
        if self._extra_failures == 1:
            log.warning("tuimon: heartbeat_extra failed (%s: %s); heartbeats go without its fields, "
                        "further failures are only counted", type(exc).__name__, exc)

    def _serve_snapshots(self) -> None:
        """Answer pending snapshot requests with the history, within the gate's limits."""
        history = self._history
        snapshot_gate.serve_requests(self._router, self._gate, lambda: (history.frames(), history.last_seq))

    def _recording_failed(self, recorder: Recorder, exc: OSError) -> None:
        """A failing disk ends the recording, not the run: the live stream carries on."""
        self._recorder = None
        log.error("tuimon: recording to %s stopped: %s", recorder.path, exc)
        with contextlib.suppress(OSError):  # already reported; the file is unusable anyway
            recorder.close()

    def _warn_once(self, msg_type: str, exc: Exception) -> None:
        key = (msg_type, type(exc))
        if key not in self._warned:
            self._warned.add(key)
            log.warning("tuimon: %s message dropped: %s (more such are counted, not logged)", msg_type, exc)

    # --- closing ---------------------------------------------------------------------------------

    def close(self, status: str = "completed", error: str | None = None, timeout: float = 2.0) -> None:
        """Send ``run_end``, deliver what is queued (at most ``timeout`` s), close everything.

        Idempotent and safe from any thread. Messages published after this are dropped.
        """
        if not self._end_once.begin(status):
            return
        self._end_body = {"status": status} if error is None else {"status": status, "error": error}
        self._stop_deadline = time.monotonic() + timeout
        self._closed = True
        self._stop.set()
        self._thread.join(timeout + 1.0)
        if self._thread.is_alive():
            log.warning("tuimon: the publisher did not stop within %.1f s; leaving it behind", timeout)
        else:
            self._context.term()  # waits at most _LINGER_MS for viewers to take run_end
        if self._registry_path is not None:
            registry.unregister(self._registry_path)

    def _close_at_exit(self) -> None:
        """The script ended without close(): report how (see :func:`end_status_at_exit`)."""
        self.close(*end_status_at_exit())

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(*end_status(exc))
