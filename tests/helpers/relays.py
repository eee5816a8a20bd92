"""A relay served on a thread for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tuimon.relay.forwarder import Relay


@contextlib.contextmanager
def running(relay: Relay) -> Iterator[Relay]:
    """Serve ``relay`` on a thread; stop it and wait for it when the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=relay.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join(timeout=5)
