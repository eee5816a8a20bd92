"""What the store hands to readers: immutable copies, taken under its lock, safe to keep and compare.

Panels compare a record with the one they drew last (frozen dataclasses compare by value) and
redraw only on a change; screens pushed over the dashboard keep an :class:`EventRecord` as long as
they like, whatever the store does meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from publisher.wire.protocol import update_words
from publisher.wire.stall import Stall
from tuimon.store.rates import Rate


@dataclass(frozen=True)
class EventRecord:
    """One anomaly episode as the viewer knows it (the latest update of its ``id``): ``step``,
    ``message`` and ``details`` say what set it off, ``latest_step`` and ``latest_message`` its
    latest repeat (None until it repeats, and in recordings older than the ``latest`` field, whose
    message is the latest repeat's)."""

    id: str
    rank: int
    step: int | None
    severity: str
    kind: str
    message: str
    details: Mapping[str, Any]
    count: int
    ts: float
    first_ts: float
    latest_step: int | None = None
    latest_message: str | None = None
    #: The latest repeat's details that differ from the first's (a stall's ``resumed``, ``paused_s``).
    latest_details: Mapping[str, Any] | None = None

    def update_text(self) -> str:
        """``×200, latest at step 601: loss 1.28 …``: the repeats since it fired ("" before any)."""
        if self.latest_message is None:
            return ""
        return update_words(self.count, {"step": self.latest_step, "message": self.latest_message})


@dataclass(frozen=True)
class InvariantRecord:
    """The latest status of one training invariant."""

    name: str
    status: str
    step: int | None
    message: str
    details: Mapping[str, Any]
    rank: int
    ts: float


@dataclass(frozen=True)
class DeviceView:
    """A GPU's latest sample plus its recent history (oldest first), for one panel row."""

    rank: int
    index: int
    latest: Mapping[str, Any]
    history: Mapping[str, list[float]]
    ts: float


@dataclass(frozen=True)
class RunView:
    """What the header needs about a run, copied out under the lock."""

    name: str
    hosts: tuple[str, ...]
    ranks: tuple[int, ...]
    world_size: int | None
    step: int | None
    step_ts: float | None
    started_ts: float | None
    last_ts: float | None
    #: The throughput over the last seconds (:mod:`tuimon.store.rates`).
    throughput: Rate | None
    gpu_source: str | None
    gpu_simulated: bool
    health: str
    end_status: str | None
    end_error: str | None
    run_start: Mapping[str, Any] | None
    gaps: int
    dropped: int
    #: Distinct metric names this viewer did not keep (over its bounds), as far as remembered.
    metrics_left_out: int = 0
    #: The stall to show (:mod:`publisher.wire.stall`): of the rank others wait for first (stuck,
    #: then busy, then waiting, the longest first), which rank, and how many ranks wait in a
    #: collective; None while no rank is stalled.
    stall: Stall | None = None
    stall_rank: int | None = None
    stall_waiting: int = 0
    #: Parts of the Monitor that failed (``telemetry_error`` events, a part once however often it
    #: is told): their figures are missing.
    telemetry_errors: int = 0


@dataclass(frozen=True)
class Counters:
    """Source-wide counters for the status line."""

    received: int
    malformed: int
    malformed_by_reason: Mapping[str, int]
    last_malformed: str | None
    gaps: int
    dropped: int
