"""Listening without a dashboard until told to stop: what ``tuimon tail`` and ``tuimon
metrics-server`` share (the dashboard runs its receiver in :class:`~tuimon.sources.live.LiveSource`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from publisher.wire.curve import JobKeys
    from tuimon.sink import Sink
    from tuimon.sources.subscriptions import Subscriptions

#: Signals that end a listening command cleanly (exit 0), as Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stopped_by_signals(stop: threading.Event, signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """While inside, ``signals`` set ``stop`` instead of killing the process (so sockets close and
    a summary is printed); the previous handlers come back on leaving."""
    previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def receive_until(
    stop: threading.Event,
    sink: Sink,
    endpoints: Sequence[str],
    registry_dir: Path | None,
    keys: JobKeys | None,
    explicit_keys: bool,
    subscriptions: Subscriptions | None = None,
) -> None:
    """Feed ``sink`` from ``endpoints`` (or the runs registered in ``registry_dir``) until ``stop``
    is set; an endpoint that cannot even be connected to is a one-line error."""
    import zmq

    from tuimon.errors import UserError
    from tuimon.sources.receiver import Receiver

    context = zmq.Context()
    try:
        Receiver(sink, context, endpoints=endpoints, registry_dir=registry_dir, keys=keys,
                 explicit_keys=explicit_keys, subscriptions=subscriptions).run(stop)
    except zmq.ZMQError as exc:
        problem = zmq.strerror(exc.errno) if exc.errno is not None else str(exc)
        raise UserError(f"cannot listen to {', '.join(endpoints)}: {problem}") from None
    finally:
        context.destroy(linger=0)
