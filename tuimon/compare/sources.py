"""Where a compared run comes from: a recording, or a live run as the viewer reaches it.

A target is read as, in this order: a recording, as every command names one (a file, a ``tuimon run
--record PREFIX`` prefix, a folder: :mod:`tuimon.sources.recording_files`); a publisher address as ``tuimon
watch`` takes it (``tcp://HOST:PORT``, ``HOST:PORT``, ``PORT``, ``ipc://PATH``); else the name of a
run in this node's run registry. A live run is listened to as ``tuimon tail`` does (its snapshot
first: its start, metric history and events) until it has caught up, its snapshot arrived or its
start heard live (a listener that connects before the run's first message is sent no snapshot:
it misses nothing), or for ``listen_s``.
Anything that goes wrong is a :class:`~tuimon.errors.UserError` naming the target and the problem.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from publisher.wire.protocol import decode
from tuimon.compare.record import RunCollector, RunRecord
from tuimon.errors import UserError
from tuimon.sink import Batch, News, Notice
from tuimon.sources.recording_files import recording_files, resolve_recordings

if TYPE_CHECKING:
    from publisher.wire.curve import JobKeys

#: Seconds a live run is listened to at most (its first heartbeat, then its snapshot, come within
#: about three).
LISTEN_S = 6.0
#: Seconds to keep listening once caught up (other ranks' snapshots, live messages).
AFTER_CAUGHT_UP_S = 0.5


def load_run(
    target: str, *, run: str | None = None, listen_s: float = LISTEN_S,
    keys: JobKeys | None = None, explicit_keys: bool = False,
) -> RunRecord:
    """The run ``target`` names (``run``: which one, when a recording holds several)."""
    files = recording_files(target)
    if files is not None:
        return _from_recordings(files, target, run)
    if not target.startswith(("tcp://", "ipc://")) and ("/" in target or target.endswith(".jsonl")):
        resolve_recordings([target])  # says what was looked for
    return _from_live(target, run, listen_s, keys, explicit_keys)


def _from_recordings(files: list[Path], target: str, run: str | None) -> RunRecord:
    from tuimon.sources.replay import load_recordings

    recording = load_recordings(files)  # a UserError naming the file when it cannot be read
    collector = RunCollector()
    collector.deliver(Batch([decode(line) for line in recording.lines], malformed=recording.malformed))
    where = str(files[0]) if len(files) == 1 else f"{target} ({len(files)} files)"
    try:
        return collector.record(where, run)
    except LookupError as exc:
        raise UserError(str(exc)) from None


class _Listening(RunCollector):
    """A collector that says when it caught up with the run: a snapshot arrived, or the run's start
    (``run_start``, ``seq`` 0) was heard live on a whole stream (through a relay a ``run_start``
    may be a late copy, sent after the rank's later messages, and the snapshot is still to come)."""

    def __init__(self) -> None:
        super().__init__()
        self.caught_up_at: float | None = None
        self.notices: list[str] = []

    def deliver(self, batch: Batch) -> None:
        super().deliver(batch)
        if self.caught_up_at is None and (batch.snapshot is not None or _start_heard(batch)):
            self.caught_up_at = time.monotonic()

    def tell(self, news: News) -> None:
        if isinstance(news, Notice) and news.text is not None and news.text not in self.notices:
            self.notices.append(news.text)


def _start_heard(batch: Batch) -> bool:
    """Whether ``batch`` heard a run's first message live, on a stream that reaches us whole."""
    return batch.complete and any(
        message["type"] == "run_start" and message.get("seq") == 0 for message in batch.live)


def _from_live(
    target: str, run: str | None, listen_s: float, keys: JobKeys | None, explicit_keys: bool
) -> RunRecord:
    import zmq

    from tuimon.sources.live import listen_targets, parse_endpoint
    from tuimon.sources.receiver import Receiver

    try:
        endpoints = [parse_endpoint(target)]
    except UserError:
        endpoints, run = [], run or target  # not an address: a run's name in the registry
    endpoints, registry_dir = listen_targets(endpoints)
    where = endpoints[0] if endpoints else f"the live run {run!r}"
    sink = _Listening()
    stop = threading.Event()
    failed: list[zmq.ZMQError] = []

    def listen() -> None:  # the receiver's sockets belong to the thread that runs it
        context = zmq.Context()
        try:
            Receiver(sink, context, endpoints=endpoints, registry_dir=registry_dir, run=run,
                     keys=keys, explicit_keys=explicit_keys).run(stop)
        except zmq.ZMQError as exc:
            failed.append(exc)
        finally:
            context.destroy(linger=0)

    thread = threading.Thread(target=listen, name="tuimon-diff-listen", daemon=True)
    deadline = time.monotonic() + listen_s
    thread.start()
    try:
        while time.monotonic() < deadline and thread.is_alive():
            if sink.caught_up_at is not None and time.monotonic() - sink.caught_up_at >= AFTER_CAUGHT_UP_S:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=2.0)
    if failed:
        raise UserError(f"cannot listen to {where}: {failed[0]}")
    try:
        record = sink.record(where, run)
    except LookupError:
        looked = endpoints[0] if endpoints else f"the run registry {registry_dir}"
        said = f" ({sink.notices[-1]})" if sink.notices else ""
        raise UserError(
            f"no recording named {target}, and no live run heard at {looked} in {listen_s:g} s{said}"
        ) from None
    if sink.caught_up_at is None:
        note = "no snapshot came: only what the run sent while listened to"
        record = replace(record, notes=(*record.notes, note))
    return record
