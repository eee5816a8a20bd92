"""How a run ended, in the words of ``run_end``: completed, interrupted or failed (with the error).

Both the :class:`~publisher.wire.transport.Publisher` and the :class:`~publisher.monitor.Monitor`
send ``run_end`` when their ``with`` block is left or the interpreter exits; one mapping from
exception to status keeps them agreeing, and one :class:`EndOnce` makes each publisher (in the
training process or in a process of its own) close once.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

from publisher.wire.protocol import RUN_END_STATUSES


def end_status(exc: BaseException | None) -> tuple[str, str | None]:
    """The ``run_end`` status and error for a run that ended with ``exc`` (None: it completed)."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return "completed", None
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", None
    return "failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:500]


def end_status_at_exit() -> tuple[str, str | None]:
    """The status of a script that ended without ``close()``: an uncaught exception sets
    ``sys.last_value`` (in an interactive session an earlier error shown at the prompt does too)."""
    return end_status(getattr(sys, "last_value", None))


class EndOnce:
    """A publisher's one close: registers ``at_exit`` (its close when the interpreter exits without
    one) and lets :meth:`begin` through once, in the process that made it."""

    def __init__(self, at_exit: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._started = False
        self._pid = os.getpid()
        self._at_exit = at_exit
        atexit.register(at_exit)

    def begin(self, status: str) -> bool:
        """Whether this close is the one to carry out: the first (thread-safe), with a valid
        ``status`` (ValueError otherwise), and not in a forked child (a DataLoader worker), which
        owns neither the threads nor what they send."""
        if status not in RUN_END_STATUSES:
            raise ValueError(f"run_end status must be one of {RUN_END_STATUSES}, got {status!r}")
        with self._lock:
            if self._started:
                return False
            self._started = True
        atexit.unregister(self._at_exit)
        return os.getpid() == self._pid
