"""What the viewer knows: every run heard from, built from decoded wire messages, with no Textual.

Sources (:mod:`tuimon.sources`) write into a :class:`Store` on their own threads; the UI reads
immutable copies (:mod:`tuimon.store.records`) on timers.
"""

from __future__ import annotations

from tuimon.sink import SourceStatus
from tuimon.store.job import CELL_METRICS, Cell, JobView, NodeView
from tuimon.store.records import Counters, DeviceView, EventRecord, InvariantRecord, RunView
from tuimon.store.series import SERIES_CAPACITY, Series
from tuimon.store.store import GPU_HISTORY, MAX_EVENTS, STALE_AFTER_S, THROUGHPUT_METRICS, Store

__all__ = [
    "CELL_METRICS",
    "GPU_HISTORY",
    "MAX_EVENTS",
    "SERIES_CAPACITY",
    "STALE_AFTER_S",
    "THROUGHPUT_METRICS",
    "Cell",
    "Counters",
    "DeviceView",
    "EventRecord",
    "InvariantRecord",
    "JobView",
    "NodeView",
    "RunView",
    "Series",
    "SourceStatus",
    "Store",
]
