"""``StepWorker``: the Monitor's background thread, which finishes each step off the training thread.

What a step captured (its numbers, read on the training thread at the step) still has to be
assembled, published and shown to the detectors. Measured on a CPU, that bookkeeping costs about
as much again as the capture when it runs between two training steps (whose kernels have evicted
its code and data from the caches) and a few microseconds per step when it runs in a batch: so the
training thread only queues the step here, and this thread handles the queue every ``interval_s``
(:data:`~publisher.wire.transport.HANDOFF_S`, 100 ms: metrics and events reach a viewer that much
later, unnoticeable to a human).

Steps are handled in the order they were queued, one at a time, so the stream keeps step order.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from publisher.threads.daemon import daemon_thread
from publisher.wire.transport import HANDOFF_S

log = logging.getLogger(__name__)

Item = TypeVar("Item")


class StepWorker(Generic[Item]):
    """Hands queued items to ``handle`` on a daemon thread, every ``interval_s``, in order.

    ``handle`` must not raise; if it does, the error is logged once and that item is lost, the
    others are handled. :meth:`submit` never blocks: beyond ``max_pending`` waiting items (the
    thread cannot keep up) it refuses the item and calls ``on_drop`` (which counts it).
    """

    def __init__(self, handle: Callable[[Item], None], on_drop: Callable[[], None], *,
                 interval_s: float = HANDOFF_S, max_pending: int = 100_000,
                 name: str = "tuimon-steps") -> None:
        self._handle = handle
        self._on_drop = on_drop
        self._interval_s = interval_s
        self._max_pending = max_pending
        self._pending: deque[Item] = deque()
        #: Queues one item without :meth:`submit`'s bound, for a caller that submits every few
        #: items anyway (the Monitor's quiet steps, at most ``publisher.monitor.QUIET_STEPS_MAX``
        #: between two full ones): one C call where :meth:`submit` is a Python one.
        self.append_unchecked = self._pending.append
        self._stopping = threading.Event()
        self._failed = False
        self._thread = daemon_thread(self._run, name)
        self._thread.start()

    def submit(self, item: Item) -> None:
        """Queue one item (thread-safe, never blocks)."""
        if len(self._pending) >= self._max_pending:
            self._on_drop()
            return
        self._pending.append(item)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread and handle what it left (on this thread if it is stuck)."""
        self._stopping.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._handle_pending()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._handle_pending()

    def _handle_pending(self) -> None:
        pending, handle = self._pending, self._handle
        while pending:
            item = pending.popleft()
            try:
                handle(item)
            except Exception:
                if not self._failed:
                    self._failed = True
                    log.exception("tuimon: finishing a step failed; that step is lost, training goes on")
