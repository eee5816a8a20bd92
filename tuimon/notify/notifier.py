"""The alerts of one viewer: what a receiver heard, decided on (:mod:`tuimon.notify.policy`) and
handed to each target's courier (:mod:`tuimon.notify.courier`).

The receiver's thread calls :meth:`Notifier.heard` with each batch (through :mod:`tuimon.notify.tap`);
it only decides and queues, so the receiver never waits for a delivery. A small thread of the
notifier's own sends the "k more suppressed" summary once the rate limit's window has room for it,
whether or not more events come.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tuimon.notify.alert import Alert, event_alert, suppressed_alert
from tuimon.notify.courier import Courier
from tuimon.notify.policy import AlertPolicy, Verdict
from tuimon.notify.settings import NotifySettings
from tuimon.notify.targets import Command, Target, Webhook
from tuimon.sink import Batch, Sink

#: Seconds the couriers get at close to deliver what is queued (a hung webhook costs no more).
CLOSE_GRACE_S = 2.0
#: Seconds between two looks at whether the summary of suppressed alerts can go.
_SUMMARY_TICK_S = 0.5


class Notifier:
    """Alerts for ``settings`` (its command and webhook; more targets with :meth:`add_target`),
    problems said on ``board``. ``clock`` measures the rate limit's window."""

    def __init__(
        self, settings: NotifySettings, board: Sink, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.board = board
        self.clock = clock
        self.policy = AlertPolicy(settings.level, settings.per_minute)
        self.couriers: list[Courier] = []
        #: Wall time at creation: through a relay, events made before it are the job's history.
        self.since = time.time()
        self._lock = threading.Lock()  # the policy: the receiver's thread and the summary's
        self._started = False
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="tuimon-alerts-summary", daemon=True)
        if settings.command is not None:
            self.add_target(Command(settings.command))
        if settings.url is not None:
            self.add_target(Webhook(settings.url))

    def add_target(self, target: Target) -> None:
        courier = Courier(target, self.board)
        self.couriers.append(courier)
        if self._started:
            courier.start()

    def start(self) -> None:
        self._started = True
        for courier in self.couriers:
            courier.start()
        self._ticker.start()

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop deciding; deliver what is queued within ``grace_s`` seconds (for all targets at once)."""
        self._stop.set()
        deadline = time.monotonic() + grace_s
        for courier in self.couriers:
            courier.close(deadline)

    # ------------------------------------------------------------------ the receiver's thread

    def heard(self, batch: Batch) -> None:
        """What a sink was handed. A snapshot's events made before :attr:`since` are history: they
        never alert, they are only remembered; one made since this viewer started, while it was
        joining, is news (the snapshot holds what the sender published before serving it, so an
        event can reach this viewer in the snapshot only). A batch of filtered streams
        (``complete`` False) may be a relay's account of the job before this viewer joined
        (docs/protocol.md, "Late joiners through a relay"), which a receiver hands over like a
        filtered live batch: its events are told apart by the same time."""
        for message in batch.history:
            if message["type"] == "event":
                self._news_or_history(message)
        complete = batch.complete
        for message in batch.live:
            if message["type"] != "event":
                continue
            if complete:
                self._offer(message)
            else:
                self._news_or_history(message)

    def _news_or_history(self, event: Mapping[str, Any]) -> None:
        """An event that may be from before this viewer: alerted if made since it started."""
        if event["ts"] < self.since:
            self._remember(event)
        else:
            self._offer(event)

    def _remember(self, event: Mapping[str, Any]) -> None:
        with self._lock:
            self.policy.remember(event)

    def _offer(self, event: Mapping[str, Any]) -> None:
        with self._lock:
            verdict = self.policy.admit(event, self.clock())
        if verdict is Verdict.SEND:
            self._send(event_alert(event))

    # ------------------------------------------------------------------------------ the rest

    def _tick(self) -> None:
        while not self._stop.wait(_SUMMARY_TICK_S):
            with self._lock:
                kinds = self.policy.take_suppressed(self.clock())
            if kinds:
                self._send(suppressed_alert(kinds, self.settings.per_minute))

    def _send(self, alert: Alert) -> None:
        for courier in self.couriers:
            courier.put(alert)

    def summary(self) -> str:
        """What became of the alerts, target by target, in one line (``tuimon tail`` ends with it)."""
        each = "; ".join(f"{c.target.name}: {c.sent} delivered, {c.failed} failed, {c.dropped} dropped"
                         for c in self.couriers)
        return f"alerts: {self.policy.suppressed_total} suppressed by the rate limit; {each}"
