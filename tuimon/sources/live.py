"""Live source: the dashboard's view of running trainings, received on a daemon thread.

A :class:`~tuimon.sources.receiver.Receiver` does the listening (SUB socket, registry scan, snapshot
client for late joiners, validation) and applies what it hears to :attr:`LiveSource.store`.
:func:`parse_endpoint` reads an address given on a command line (every command that takes one uses
it); :func:`listen_targets` decides where a viewer listens: those addresses, else the run registry
(``watch`` and ``tail`` share it).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from publisher.wire.curve import JobKeys
from publisher.wire.registry import runtime_dir
from tuimon.errors import UserError
from tuimon.sink import Sink
from tuimon.sources.base import RankFocus, Source
from tuimon.sources.receiver import (
    REGISTRY_SCAN_S,
    SILENT_ENDPOINT_S,
    SNAPSHOT_TIMEOUT_S,
    WAITING_HINT,
    Receiver,
    describe_targets,
)
from tuimon.sources.subscriptions import Subscriptions
from tuimon.store import Store

__all__ = [
    "ENDPOINT_EXAMPLE",
    "REGISTRY_SCAN_S",
    "SILENT_ENDPOINT_S",
    "SNAPSHOT_TIMEOUT_S",
    "LiveSource",
    "listen_targets",
    "parse_endpoint",
]

ENDPOINT_EXAMPLE = "tcp://127.0.0.1:5555"
_TCP = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>\d+)")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>\d+)")


def parse_endpoint(text: str) -> str:
    """Normalise an endpoint given on the command line, or raise a :class:`UserError`.

    Accepts ``tcp://HOST:PORT``, ``HOST:PORT``, a bare ``PORT`` (on 127.0.0.1) and ``ipc://PATH``.
    """
    candidate = text.strip()
    if candidate.isdigit():
        candidate = f"tcp://127.0.0.1:{candidate}"
    elif _HOST_PORT.fullmatch(candidate):
        candidate = f"tcp://{candidate}"
    if candidate.startswith("ipc://"):
        if len(candidate) > len("ipc://"):
            return candidate
        problem = "an ipc:// endpoint needs a socket path"
    elif match := _TCP.fullmatch(candidate):
        port = int(match["port"])
        if match["host"] == "*":
            problem = "'*' is for binding; to watch, give the host the publisher runs on"
        elif not 0 < port < 65536:
            problem = f"port {port} is out of range 1-65535"
        else:
            return candidate
    elif candidate.startswith("tcp://"):
        problem = "a tcp:// endpoint needs HOST:PORT"
    else:
        problem = "not a ZeroMQ endpoint"
    raise UserError(
        f"bad endpoint {text!r}: {problem}; use tcp://HOST:PORT, HOST:PORT or PORT (e.g. {ENDPOINT_EXAMPLE})"
    )


def listen_targets(
    endpoints: Sequence[str], registry_dir: Path | None = None
) -> tuple[list[str], Path | None]:
    """Where to listen: the ``endpoints`` normalised, or, when there are none, the registry folder
    to scan (``registry_dir``, else the user's runtime folder). Raises a :class:`UserError` for a
    bad endpoint or an unusable runtime folder, before anything is opened."""
    parsed = [parse_endpoint(endpoint) for endpoint in endpoints]
    if not parsed and registry_dir is None:
        try:
            registry_dir = runtime_dir()
        except PermissionError as exc:
            raise UserError(str(exc)) from None
    return parsed, registry_dir


class LiveSource:
    """Receives live messages on a background thread into :attr:`store`.

    With ``endpoints`` it connects to those; without, to every live run in the publisher registry,
    rescanned every :data:`REGISTRY_SCAN_S` for new ones. ``run`` keeps only that run. ``clock``
    is the store's "now" (wall time; a fixed one makes what the screen says reproducible, for
    snapshot tests). ``tap``, when given, wraps the store in the sink the receiver fills (the
    alerts of ``tuimon watch`` hear what the store is handed, after it), while the app reads the
    store itself.
    """

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        *,
        run: str | None = None,
        registry_dir: Path | None = None,
        waiting_hint: str = WAITING_HINT,
        clock: Callable[[], float] = time.time,
        keys: JobKeys | None = None,
        explicit_keys: bool = False,
        tap: Callable[[Sink], Sink] | None = None,
    ) -> None:
        self.endpoints, self.registry_dir = listen_targets(endpoints, registry_dir)
        self._tap = tap
        self.run = run
        self.waiting_hint = waiting_hint
        self.store = Store(clock)
        self._keys, self._explicit_keys = keys, explicit_keys
        #: What the receiver subscribes to: everything, or through a relay the job's topics.
        self.subscriptions = Subscriptions()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------ control (any thread)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="tuimon-receiver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def focus_rank(self, run: str, rank: int) -> None:
        """Through a relay: receive this rank's full stream for ``run`` (metrics, GPUs), not only
        its node's summaries. Direct from publishers every rank's stream arrives anyway."""
        self.subscriptions.focus(run, rank)

    def where(self) -> str:
        """Where this source looks, in words (for "waiting" messages)."""
        return describe_targets(self.endpoints, self.registry_dir)

    # ---------------------------------------------------------------------------- receiver thread

    def _main(self) -> None:
        context = zmq.Context()
        try:
            receiver = Receiver(
                self._tap(self.store) if self._tap is not None else self.store,
                context,
                endpoints=self.endpoints,
                registry_dir=self.registry_dir,
                run=self.run,
                waiting_hint=self.waiting_hint,
                subscriptions=self.subscriptions,
                keys=self._keys,
                explicit_keys=self._explicit_keys,
            )
            receiver.run(self._stop)
        finally:
            context.destroy(linger=0)


if TYPE_CHECKING:  # mypy: a LiveSource is a source the app can show (a missing method fails here),
    _CONFORMS: type[Source] = LiveSource
    _FOCUSES: type[RankFocus] = LiveSource  # and one the job view can point at a rank
