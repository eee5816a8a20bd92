"""One target's deliveries: a bounded queue and a thread of their own, so nobody ever waits for them.

The receiver hands alerts over with :meth:`Courier.put`, which never blocks: when the queue is
full (the target is down or slow and alerts keep coming) the alert is dropped, counted and said.
The courier's thread delivers in order, retrying a failed attempt after a backoff that doubles
(:data:`BACKOFF_S`, 2x, ... at most :data:`ATTEMPTS` attempts: about 15 s of trying) and gives up
loudly. Each target has its own courier, so a webhook that hangs does not hold back the command.
"""

from __future__ import annotations

import queue
import threading
import time

from tuimon.notify.alert import Alert
from tuimon.notify.targets import DeliveryError, Target
from tuimon.sink import Notice, Sink

#: Alerts waiting for one target at most.
QUEUE_SIZE = 64
#: Attempts per alert, and the wait before the second (doubled before each next one).
ATTEMPTS = 5
BACKOFF_S = 1.0
#: Seconds a problem stays said (the status line's notice; tail repeats it once it lapsed).
NOTICE_TTL_S = 30.0


class Courier:
    """Delivers alerts to ``target`` from its own daemon thread; counts ``sent``, ``failed``
    (given up after retries) and ``dropped`` (the queue was full, or still held at close).
    Problems are told to ``board`` as notices: the sink the alerts tap (the dashboard's status
    line, tail's stderr)."""

    def __init__(self, target: Target, board: Sink, *, backoff_s: float = BACKOFF_S) -> None:
        self.target = target
        self.board = board
        self.backoff_s = backoff_s
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue[Alert] = queue.Queue(QUEUE_SIZE)
        self._closing = threading.Event()  # deliver what is queued, then end
        self._give_up = threading.Event()  # the grace is over: stop waiting to retry
        self._thread = threading.Thread(target=self._run, name=f"tuimon-alerts {target.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, alert: Alert) -> None:
        """Queue ``alert``; never blocks."""
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self.dropped += 1
            self._say("dropped", f"alert to {self.target.name} dropped: {QUEUE_SIZE} already waiting "
                      f"({self.dropped} dropped so far)")

    def close(self, deadline: float) -> None:
        """Deliver what is queued until ``deadline`` (``time.monotonic``), then leave the rest,
        counted as dropped; a target that hangs holds only its daemon thread."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self._give_up.set()
        left = self._queue.qsize() + (1 if self._thread.is_alive() else 0)  # plus the one in hand
        if left:
            self.dropped += left
            self._say("closing", f"{left} alert(s) to {self.target.name} not delivered before closing")

    def _run(self) -> None:
        while True:
            try:
                alert = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            self._deliver(alert)

    def _deliver(self, alert: Alert) -> None:
        delay = self.backoff_s
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self.target.send(alert)
            except DeliveryError as exc:
                if not exc.retry or attempt == ATTEMPTS or self._give_up.wait(delay):
                    self.failed += 1
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    self._say("failed", f"alert to {self.target.name} failed{tries}: {exc}")
                    return
                delay *= 2
            else:
                self.sent += 1
                return

    def _say(self, what: str, text: str) -> None:
        self.board.tell(Notice(f"alerts:{what}:{self.target.name}", text, ttl_s=NOTICE_TTL_S))
