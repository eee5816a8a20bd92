"""Alerts from the messages a :class:`~tuimon.sources.receiver.Receiver` hands its sink.

The receiver already tells history from live news: a late joiner's snapshot comes through
``apply_snapshot`` (its ``messages`` from before joining, ``then`` the live ones newer than it),
everything else through ``apply_batch``. So the notifier taps that boundary instead of listening
again: whatever a viewer shows or prints, and only that, can alert, with the same discovery,
validation and snapshot logic. Each message goes to the wrapped sink first, then to the notifier,
which only decides and queues.

- :class:`AlertingSink` wraps any sink (``tuimon tail``'s printer).
- :class:`AlertingStore` is a :class:`~tuimon.store.Store` that does the same, and
  :class:`AlertingLiveSource` a live source whose receiver fills one: a
  :class:`~tuimon.sources.live.LiveSource` hands its own store to its receiver, and the dashboard
  reads that store, so the tap has to be the store itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuimon.notify.notifier import Notifier
from tuimon.notify.settings import NotifySettings
from tuimon.sources.live import LiveSource
from tuimon.store import Store

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


class AlertingStore(Store):
    """A store whose live messages also go to :attr:`notifier` (set once, before it is filled)."""

    notifier: Notifier

    def apply_batch(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        received: int | None = None,
        malformed: Iterable[ProtocolError] = (),
        complete: bool = True,
    ) -> None:
        messages = list(messages)
        super().apply_batch(messages, received=received, malformed=malformed, complete=complete)
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
        super().apply_snapshot(run, rank, messages, seq, then=then, malformed=malformed)
        self.notifier.heard_snapshot(messages, then)


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
        super().__init__(endpoints, run=run, keys=keys, explicit_keys=explicit_keys)
        store = AlertingStore(self.store.clock)
        self.notifier = store.notifier = Notifier(alerts, store)
        self.store = store

    def start(self) -> None:
        self.notifier.start()
        super().start()

    def stop(self) -> None:
        super().stop()
        self.notifier.close()


if TYPE_CHECKING:  # mypy: both taps are sinks a Receiver can fill (a missing method fails here)
    _SINK: type[MessageSink] = AlertingSink
    _STORE: type[MessageSink] = AlertingStore
