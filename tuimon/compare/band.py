"""A run held against a baseline recording (``--baseline``): the band drawn around the baseline's
curves, and an event when a run leaves it.

The band is the rule of :mod:`tuimon.compare.curves` drawn: at each step, the baseline's running
median over :data:`~tuimon.compare.curves.WINDOW` steps, plus or minus the allowance for the
median of that many differences between two runs with the baseline's own noise. A run is watched
step by step with :class:`~tuimon.compare.curves.PartingWatch`, exactly as ``tuimon diff``
compares two runs (the baseline's noise standing for both): the loss and the throughput of each
run's lowest rank. A single point outside the band does not make an event; the median of the
run's last differences from the baseline does, held for a few steps.

Leaving the band is an event of kind ``baseline_departure``, one per episode (the run comes back
into the band for a few steps before a new one can begin), made by the viewer (``by:
"baseline"``): it shows in the event log with the others, marks the chart, can open an incident
and alerts like any other (docs/protocol.md, "Messages a viewer makes").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire.protocol import decode, encode, make_message, numbered_by_sender, read_number, wire_number
from tuimon.compare.curves import WINDOW, Curve, PartingWatch, allowance, running_medians
from tuimon.compare.record import RunRecord
from tuimon.compare.sources import load_run
from tuimon.sink import Batch, News, Sink
from tuimon.sources.recording_files import resolve_recordings
from tuimon.store import Store

#: The event kind of a run leaving the baseline's band (publisher/wire/event_kinds.py).
KIND = "baseline_departure"
#: Who makes the event (the envelope's ``by``: not numbered by the run's own sender).
MADE_BY = "baseline"


@dataclass(frozen=True)
class Band:
    """The baseline's band over a range of steps, for a chart: its running median and edges."""

    label: str
    steps: list[int]
    center: list[float]
    low: list[float]
    high: list[float]


class Baseline:
    """A finished run that others are held against (``tuimon watch/replay --baseline``); its bands
    are computed once, here."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        #: The metrics a run is watched on: the loss and the baseline's throughput.
        self.watched = tuple(name for name in ("loss", record.throughput or "") if name in record.curves)
        self._bands = {name: _band(curve) for name, curve in record.curves.items()}

    @property
    def label(self) -> str:
        return f"baseline {self.record.name}"

    def band(self, metric: str, first: int, last: int) -> Band | None:
        """The band of ``metric`` from step ``first`` to ``last`` (None: no baseline points there)."""
        whole = self._bands.get(metric)
        if whole is None:
            return None
        start, stop = bisect.bisect_left(whole.steps, first), bisect.bisect_right(whole.steps, last)
        if start >= stop:
            return None
        return Band(self.label, whole.steps[start:stop], whole.center[start:stop], whole.low[start:stop],
                    whole.high[start:stop])


def _band(curve: Curve) -> _Whole:
    """The running median of ``curve`` over :data:`WINDOW` points centred on each, and the
    allowance for that many differences from a run as noisy as it is, either side."""
    whole = _Whole([], [], [], [])
    medians = running_medians(curve.values, len(curve), WINDOW // 2, WINDOW // 2)
    for step, median, noise in zip(curve.steps, medians, curve.noise, strict=True):
        if median is None:
            continue
        half = allowance(noise, noise, WINDOW, median)
        whole.steps.append(step)
        whole.center.append(median)
        whole.low.append(median - half)
        whole.high.append(median + half)
    return whole


@dataclass
class _Whole:
    steps: list[int]
    center: list[float]
    low: list[float]
    high: list[float]


def load_baseline(path: str) -> Baseline:
    """The baseline recorded at ``path`` (a file, a ``--record`` prefix, a folder); a UserError otherwise."""
    resolve_recordings([path], "baseline recording")  # a UserError saying what was looked for
    return Baseline(load_run(path))


@dataclass
class _Watched:
    """One run's watch: its lowest rank heard, and a watch per metric."""

    rank: int
    watches: dict[str, PartingWatch] = field(default_factory=dict)


class BaselineWatch(Sink):
    """``sink``, plus a ``baseline_departure`` event when a run heard leaves ``baseline``'s band.

    Every batch goes to ``sink`` first; the events it gives rise to follow as a batch of their own.
    ``store`` is the store that ``sink`` fills (itself, or behind an alerting sink): when its
    generation moves (a replay rebuilt it from the start), the watch starts over with it.
    """

    def __init__(self, sink: Sink, baseline: Baseline, store: Store) -> None:
        self.sink = sink
        self.baseline = baseline
        self._store = store
        self._seen_generation = store.generation
        self._runs: dict[str, _Watched] = {}
        self._seq = 0
        self._episodes = 0

    def deliver(self, batch: Batch) -> None:
        if self._store.generation != self._seen_generation:
            self._seen_generation = self._store.generation
            self._runs.clear()
        self.sink.deliver(batch)
        events = [event for message in batch.messages if message["type"] == "metrics"
                  and numbered_by_sender(message) for event in self._observe(message)]
        if events:
            self.sink.deliver(Batch(events))

    def tell(self, news: News) -> None:
        self.sink.tell(news)

    def _observe(self, message: Mapping[str, Any]) -> list[dict[str, Any]]:
        run, rank = message["run"], message["rank"]
        watched = self._runs.get(run)
        if watched is None or rank < watched.rank:
            watched = self._runs[run] = _Watched(rank)
        if rank != watched.rank:
            return []
        events = []
        step = message["step"]
        for metric in self.baseline.watched:
            value = read_number(message["metrics"].get(metric))
            at = self.baseline.record.curves[metric].at(step)
            if value is None or at is None:
                continue
            watch = watched.watches.setdefault(metric, PartingWatch())
            found = watch.observe(step, value, at[0], at[1], at[1])
            if found is not None:
                events.append(self._event(message, metric, found.step, found.a, found.b,
                                          found.difference, found.allowed))
        return events

    def _event(self, message: Mapping[str, Any], metric: str, step: int, value: float, base: float,
               difference: float, allowed: float) -> dict[str, Any]:
        """The event, checked as any message a viewer receives (a bug here shows as malformed)."""
        self._episodes += 1
        self._seq += 1
        record = self.baseline.record
        severity = "warning"
        if not math.isfinite(difference):
            words = f"{metric} is {value:.4g} at step {step} where the baseline's is {base:.4g}"
            direction = "not finite"
        else:
            direction = "above" if difference > 0 else "below"
            words = (f"{metric} {direction} the baseline's band from step {step}: {value:.4g} against "
                     f"{base:.4g}, the median difference {difference:+.3g} beyond the noise's {allowed:.3g}")
            if (direction == "below") == (metric == "loss"):  # learning or training faster
                severity = "info"
        details = {
            "metric": metric,
            "direction": direction,
            "first_step": step,
            "value": wire_number(value),
            "baseline_value": wire_number(base),
            "median_difference": wire_number(difference),
            "allowed": wire_number(allowed),
            "baseline_run": record.name,
            "baseline_recording": record.where,
            "likely_causes": _CAUSES.get(metric, _LOSS_CAUSES),
        }
        event = make_message(
            "event", run=message["run"], rank=message["rank"], host=message["host"], ts=message["ts"],
            seq=self._seq, step=step, id=f"{MADE_BY}/{metric}/{self._episodes}", severity=severity,
            kind=KIND, message=f"{words} (baseline {record.name})", details=details, count=1, by=MADE_BY,
        )
        return decode(encode(event))


_LOSS_CAUSES = ["a changed setting (learning rate, batch size, schedule): `tuimon diff` the two runs",
                "changed code or data since the baseline", "another seed: compare two seeds of the baseline"]
_SPEED_CAUSES = ["another load on the machine", "a slower device, or a smaller batch",
                 "more work per step (longer sequences, a changed model)"]
_CAUSES = {"loss": _LOSS_CAUSES, "tokens_per_s": _SPEED_CAUSES, "samples_per_s": _SPEED_CAUSES}
