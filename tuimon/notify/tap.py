"""Alerts from the messages a :class:`~tuimon.sources.receiver.Receiver` hands its sink.

The receiver already tells history from live news: a late joiner's snapshot comes through
``apply_snapshot`` (its ``messages`` from before joining, ``then`` the live ones newer than it),
everything else through ``apply_batch``. So the notifier taps that boundary instead of listening
again: whatever a viewer shows or prints, and only that, can alert, with the same discovery,
validation and snapshot logic. Each message goes to the wrapped sink first, then to the notifier,
which only decides and queues.

- :class:`AlertingSink` wraps any sink: ``tuimon tail``'s printer, and the dashboard's store
  through :class:`AlertingLiveSource` (a live source whose receiver fills the wrapped store).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuimon.notify.notifier import Notifier
from tuimon.notify.settings import NotifySettings
from tuimon.sources.live import LiveSource

if TYPE_CHECKING:
    from publisher.wire.curve import JobKeys
    from publisher.wire.protocol import ProtocolError
    from tuimon.sources.receiver import MessageSink
    from tuimon.store import SourceStatus


class AlertingSink:
    """``sink``, plus alerts from what it is handed (a :class:`MessageSink` itself)."""

    def __init__(self, sink: MessageSink, notifier: Notifier) -> None:
        self.sink = sink
        self.notifier = notifier

    def apply_batch(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        received: int | None = None,
        malformed: Iterable[ProtocolError] = (),
        complete: bool = True,
    ) -> None:
        messages = list(messages)
        self.sink.apply_batch(messages, received=received, malformed=malformed, complete=complete)
        self.notifier.heard_batch(messages, complete=complete)

    def apply_snapshot(
        self,
        run: str,
        rank: int,
        messages: Iterable[Mapping[str, Any]],
        seq: int,
        *,
        then: Iterable[Mapping[str, Any]] = (),
        malformed: Iterable[ProtocolError] = (),
    ) -> None:
        messages, then = list(messages), list(then)
        self.sink.apply_snapshot(run, rank, messages, seq, then=then, malformed=malformed)
        self.notifier.heard_snapshot(messages, then)

    def count_malformed(self, error: ProtocolError, where: str | None = None) -> None:
        self.sink.count_malformed(error, where)

    def set_notice(self, key: str, text: str | None, *, ttl_s: float | None = None) -> None:
        self.sink.set_notice(key, text, ttl_s=ttl_s)

    def set_source_status(self, status: SourceStatus) -> None:
        self.sink.set_source_status(status)


class AlertingLiveSource(LiveSource):
    """A :class:`LiveSource` whose store alerts as ``alerts`` say (:attr:`notifier`, problems on
    the dashboard's notice lines); the notifier starts and stops with the source."""

    def __init__(
        self,
        endpoints: Sequence[str] = (),
        *,
        alerts: NotifySettings,
        run: str | None = None,
        keys: JobKeys | None = None,
        explicit_keys: bool = False,
    ) -> None:
        super().__init__(endpoints, run=run, keys=keys, explicit_keys=explicit_keys,
                         tap=lambda store: AlertingSink(store, self.notifier))
        self.notifier = Notifier(alerts, self.store)

    def start(self) -> None:
        self.notifier.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        self.notifier.close()


if TYPE_CHECKING:  # mypy: the tap is a sink a Receiver can fill (a missing method fails here)
    _SINK: type[MessageSink] = AlertingSink
