"""``SidecarPublisher``: a rank's publisher run in a process of its own, fed once per hand-off period.

The training process keeps only a queue: :meth:`SidecarPublisher.publish` appends to it (any thread,
never blocks), and one thread of this class, every :data:`~publisher.wire.transport.HANDOFF_S`,
encodes what is queued as one JSON array (orjson, one C call) and sends it to the publisher's
process (:mod:`publisher.wire.sidecar`) in one ZeroMQ frame. Numbering, encoding each message,
sending, recording, snapshots and heartbeats, the Python that a sender thread ran for every
message while holding the training process's GIL, happen there (docs/benchmarks.md: ~30 µs a step at ~1 ms
steps on a CPU, paid again by the training thread in waits for the GIL).

It takes the arguments of :class:`~publisher.wire.transport.Publisher` that a Monitor uses and
raises what that constructor raises (an unusable endpoint, an unwritable recording, a bad
``$TUIMON_HOST``), once the publisher's process has tried them. ``heartbeat_extra`` is called on
this class's thread at each hand-over; its fields ride on the heartbeats, which stop when
this process stops answering (:mod:`publisher.wire.sidecar` says how).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import orjson
import zmq

from publisher.wire.protocol import MESSAGE_TYPES
from publisher.wire.run_end import EndOnce, end_status_at_exit
from publisher.wire.transport import HANDOFF_S

log = logging.getLogger(__name__)

#: Seconds the publisher's process may take to start and bind (it imports ZeroMQ and orjson only).
START_TIMEOUT_S = 30.0
#: Items in one frame at most (a backlog after a pause goes out in several).
_FRAME_ITEMS = 5_000
#: The folder that holds the ``publisher`` package, for the publisher's process to import it from.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: What the publisher's process counts, before it has said anything.
_NO_STATS = dict.fromkeys(("sent", "dropped", "queued", "recorded", "snapshots", "snapshots_refused",
                           "bad_requests", "refused", "link_drops"), 0)


class SidecarPublisher:
    """One rank's stream, published by a process of its own (see the module's docstring)."""

    def __init__(
        self,
        run: str,
        rank: int = 0,
        *,
        endpoint: str | None = None,
        record: str | os.PathLike[str] | None = None,
        heartbeat_s: float = 1.0,
        heartbeat_extra: Callable[[], Mapping[str, Any]] | None = None,
        queue_max: int = 100_000,
        detectors: Sequence[str] = (),
    ) -> None:
        self.run = run
        self.rank = rank
        self._heartbeat_extra = heartbeat_extra
        self._extra_failed = False
        self._queue: deque[list[Any]] = deque()
        self._queue_max = queue_max
        self._drop_lock = threading.Lock()
        self._dropped = 0  # given up here (queue full, closed, not encodable, not handed over)
        self._drops_said = 0  # of which the publisher's process has been told
        self._stats: dict[str, int] = dict(_NO_STATS)
        self._closed = False
        self._end: list[Any] = []
        self._stop = threading.Event()
        self._folder = tempfile.mkdtemp(prefix="tuimon-publisher-")  # only this user can enter it
        self._context = zmq.Context()
        self._inbox = self._context.socket(zmq.PAIR)
        self._inbox.setsockopt(zmq.LINGER, 1000)
        self._process: subprocess.Popen[bytes] | None = None
        try:
            address = f"ipc://{self._folder}/inbox"
            self._inbox.bind(address)
            self._process, started = _start(run, rank, endpoint, record, heartbeat_s, address, detectors)
            if not self._inbox.poll(int(START_TIMEOUT_S * 1000)):  # its first stats: connected
                raise SidecarUnavailable(f"tuimon's publisher process did not connect within "
                                         f"{START_TIMEOUT_S:.0f} s")
            self._take_stats()
        except BaseException:
            self._release()
            raise
        self.endpoint: str = started["endpoint"]
        self.snapshot_endpoint: str = started["snapshot"]
        self._thread = threading.Thread(target=self._run, name=f"tuimon-publisher-{rank}", daemon=True)
        self._thread.start()
        self._end_once = EndOnce(self._close_at_exit)

    def publish(self, msg_type: str, step: int | None = None, **body: Any) -> None:
        """Queue one message, as :meth:`Publisher.publish <publisher.wire.transport.Publisher.publish>`
        does (thread-safe, never blocks, drops and counts it when the queue is full); ``body`` is
        encoded on this class's thread, so it must not be changed afterwards."""
        if msg_type not in MESSAGE_TYPES:
            raise ValueError(f"unknown message type {msg_type!r}; expected one of {sorted(MESSAGE_TYPES)}")
        if self._closed or len(self._queue) >= self._queue_max:
            self.count_drop()
            return
        self._queue.append(["m", msg_type, step, time.time(), body])

    def share_context(self, fields: Mapping[str, Any]) -> None:
        """Queue what the training process told its detectors, for those that run in the
        publisher's process (:meth:`TrainingContext.update
        <publisher.detectors.base.TrainingContext.update>`); in order with the messages."""
        if not self._closed:
            self._queue.append(["ctx", dict(fields)])

    def count_drop(self) -> None:
        """Count one message its producer gave up (it shows in :meth:`stats` and the heartbeats)."""
        with self._drop_lock:
            self._dropped += 1

    @property
    def pid(self) -> int:
        """The publisher's process (the registry entry names the training process, this one)."""
        assert self._process is not None
        return self._process.pid

    def stats(self) -> dict[str, int]:
        """:meth:`Publisher.stats <publisher.wire.transport.Publisher.stats>` as the publisher's
        process last said it, with what is still queued here and the drops it has not heard of."""
        said = self._stats
        counts = {key: value for key, value in said.items() if key != "link_drops"}
        counts["queued"] = said["queued"] + len(self._queue)
        counts["dropped"] = said["dropped"] + self._dropped - said["link_drops"]
        return counts

    # --- this class's thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.wait(HANDOFF_S):
                self._hand_over(beat=True)
            self._hand_over(beat=False)
            self._say_close()
        except Exception:
            log.exception("tuimon: handing messages to the publisher's process failed; monitoring "
                          "stops, training goes on")
        finally:
            self._closed = True

    def _hand_over(self, beat: bool) -> None:
        """Send what is queued and, with ``beat``, the heartbeat fields as they are now (every
        hand-over: a heartbeat then says what was true at most one hand-over before it, as when
        it was made on a thread of this process), in frames; take the process's latest stats."""
        queue = self._queue
        while True:
            items = [queue.popleft() for _ in range(min(len(queue), _FRAME_ITEMS))]
            with self._drop_lock:
                drops, self._drops_said = self._dropped - self._drops_said, self._dropped
            if drops:
                items.append(["drops", drops])
            if beat:
                items.append(["beat", self._beat_fields()])
                beat = False
            if not items:
                break
            try:
                self._inbox.send(self._encode(items), zmq.NOBLOCK)
            except zmq.Again:  # the process is not taking frames (stuck): these are lost, and counted
                lost = sum(1 for item in items if item[0] == "m")
                with self._drop_lock:
                    self._dropped += lost
            if not queue:
                break
        self._take_stats()

    def _encode(self, items: list[list[Any]]) -> bytes:
        """One JSON array; an item that cannot be encoded (a bug in its producer) is dropped alone."""
        try:
            return orjson.dumps(items)
        except TypeError:
            parts = []
            for item in items:
                try:
                    parts.append(orjson.dumps(item))
                except TypeError as exc:
                    self.count_drop()
                    log.warning("tuimon: a %s message could not be encoded and is dropped: %s", item[1], exc)
            return b"[" + b",".join(parts) + b"]"

    def _beat_fields(self) -> Mapping[str, Any]:
        if self._heartbeat_extra is None:
            return {}
        try:
            return self._heartbeat_extra()
        except Exception as exc:  # asked at every hand-over: said once, not ten times a second
            if not self._extra_failed:
                self._extra_failed = True
                log.warning("tuimon: heartbeat_extra failed (%s: %s); heartbeats go without its fields, "
                            "further failures are not logged", type(exc).__name__, exc)
            return {}

    def _take_stats(self, wait_s: float = 0.0) -> None:
        """Read the stats the process sent, the latest last; wait up to ``wait_s`` for the first."""
        wait_ms = int(wait_s * 1000)
        while self._inbox.poll(wait_ms):
            wait_ms = 0
            with contextlib.suppress(orjson.JSONDecodeError):
                said = orjson.loads(self._inbox.recv())
                if isinstance(said, dict):
                    self._stats = {**_NO_STATS, **said}

    def _say_close(self) -> None:
        """Tell the process to send ``run_end`` and stop; take its last stats."""
        status, error, timeout = self._end
        with contextlib.suppress(zmq.Again):
            self._inbox.send(orjson.dumps([["close", status, error, timeout]]), zmq.NOBLOCK)
            self._take_stats(wait_s=timeout + 1.0)

    # --- closing ---------------------------------------------------------------------------------

    def close(self, status: str = "completed", error: str | None = None, timeout: float = 2.0) -> None:
        """Hand over what is queued, have the process send ``run_end`` and deliver (at most
        ``timeout`` s), then stop it. Idempotent and safe from any thread; messages published
        after this are dropped."""
        if not self._end_once.begin(status):
            return
        self._end = [status, error, timeout]
        self._stop.set()
        self._thread.join(timeout + 3.0)
        self._closed = True
        self._release(wait_s=timeout + 2.0)

    def _release(self, wait_s: float = 0.0) -> None:
        """Wait for the process (at most ``wait_s``, then stop it), close the socket, remove the folder."""
        process = self._process
        if process is not None:
            try:
                process.wait(wait_s)
            except subprocess.TimeoutExpired:
                log.warning("tuimon: the publisher's process did not stop in %.1f s; stopping it", wait_s)
                process.kill()
                process.wait()
        self._inbox.close(linger=0)
        self._context.term()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _close_at_exit(self) -> None:
        """The script ended without close(): report how (see :func:`end_status_at_exit`)."""
        self.close(*end_status_at_exit())


def _start(run: str, rank: int, endpoint: str | None, record: str | os.PathLike[str] | None,
           heartbeat_s: float, inbox: str,
           detectors: Sequence[str]) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """Start the publisher's process and wait for it to bind; raise what it could not do.
    ``detectors``: the names of those it runs on the metrics it publishes."""
    env = {key: value for key, value in os.environ.items() if key != "TUIMON_AUTOSTART"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (_SOURCE_ROOT, env.get("PYTHONPATH"))))
    try:
        process = subprocess.Popen([sys.executable, "-m", "publisher.publisher_process"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
    except OSError as exc:  # no interpreter to start (an embedded or frozen Python): not the user's settings
        raise SidecarUnavailable(f"tuimon's publisher process could not start ({exc})") from exc
    assert process.stdin is not None and process.stdout is not None
    settings = {"run": run, "rank": rank, "endpoint": endpoint,
                "record": None if record is None else os.fspath(record), "heartbeat_s": heartbeat_s,
                "inbox": inbox, "parent": os.getpid(), "detectors": list(detectors)}
    try:
        process.stdin.write(orjson.dumps(settings) + b"\n")
        process.stdin.close()
        answer = _answer(process.stdout, START_TIMEOUT_S)
    except BaseException:
        process.kill()
        process.wait()
        raise
    process.stdout.close()
    if "error" in answer:
        process.wait()
        kind = {"ValueError": ValueError, "OSError": OSError, "PermissionError": PermissionError,
                "FileNotFoundError": FileNotFoundError}.get(answer.get("kind", ""), RuntimeError)
        raise kind(answer["error"])
    return process, answer


def _answer(stdout: IO[bytes], timeout_s: float) -> dict[str, Any]:
    """The publisher's process's start-up line."""
    ready, _, _ = select.select([stdout], [], [], timeout_s)
    line = stdout.readline() if ready else b""
    if not line:
        raise SidecarUnavailable(f"tuimon's publisher process did not start within {timeout_s:.0f} s "
                                 "(its error, if any, is above)" if not ready else
                                 "tuimon's publisher process ended before it started (its error is above)")
    try:
        answer = orjson.loads(line)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise SidecarUnavailable(f"tuimon's publisher process said {line[:200]!r} at start-up")
    return answer


class SidecarUnavailable(RuntimeError):
    """The publisher's process could not be started (not a setting of the user's: the Monitor then
    publishes from a thread of the training process instead, :mod:`publisher.wiring`)."""
