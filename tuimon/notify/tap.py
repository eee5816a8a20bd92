"""Alerts from the messages a :class:`~tuimon.sources.receiver.Receiver` hands its sink.

The receiver already tells history from live news: a batch that begins with a late joiner's
snapshot says so (:attr:`~tuimon.sink.Batch.history`, then the live messages newer than it). So the
notifier taps that boundary instead of listening again: whatever a viewer shows or prints, and only
that, can alert, with the same discovery, validation and snapshot logic. Each batch goes to the
wrapped sink first, then to the notifier, which only decides and queues; notices and the source's
status go on to the wrapped sink untouched.

- :class:`AlertingSink` wraps any sink: ``tuimon tail``'s printer, and the dashboard's store
  through :class:`AlertingLiveSource` (a live source whose receiver fills the wrapped store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tuimon.notify.notifier import Notifier
from tuimon.notify.settings import NotifySettings
from tuimon.sink import Batch, News, Sink
from tuimon.sources.live import LiveSource

if TYPE_CHECKING:
    from publisher.wire.curve import JobKeys


class AlertingSink(Sink):
    """``sink``, plus alerts from what it is handed."""

    def __init__(self, sink: Sink, notifier: Notifier) -> None:
        self.sink = sink
        self.notifier = notifier

    def deliver(self, batch: Batch) -> None:
        self.sink.deliver(batch)
        self.notifier.heard(batch)

    def tell(self, news: News) -> None:
        self.sink.tell(news)


class AlertingLiveSource(LiveSource):
    """A :class:`LiveSource` whose store alerts as ``alerts`` say (:attr:`notifier`, problems on
    the dashboard's notice lines); the notifier starts and stops with the source. ``outer`` wraps
    the alerting sink in one more (a baseline watch, whose events then alert too)."""

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        *,
        alerts: NotifySettings,
        run: str | None = None,
        keys: JobKeys | None = None,
        explicit_keys: bool = False,
        outer: Callable[[Sink], Sink] | None = None,
    ) -> None:
        def tap(store: Sink) -> Sink:
            alerting = AlertingSink(store, self.notifier)
            return outer(alerting) if outer is not None else alerting

        super().__init__(endpoints, run=run, keys=keys, explicit_keys=explicit_keys, tap=tap)
        self.notifier = Notifier(alerts, self.store)

    def start(self) -> None:
        self.notifier.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        self.notifier.close()
