"""How a run ended, in the words of ``run_end``: completed, interrupted or failed (with the error).

Both the :class:`~publisher.wire.transport.Publisher` and the :class:`~publisher.monitor.Monitor`
send ``run_end`` when their ``with`` block is left or the interpreter exits; one mapping from
exception to status keeps them agreeing.
"""

from __future__ import annotations

import sys


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
