"""What a comparison needs of a run, gathered from its messages: a :class:`~tuimon.sink.Sink`
that a recording is played into, or a live run's receiver fills.

Unlike the viewer's store it keeps every step of the few metrics compared (a baseline's early
steps matter as much as its last), one run's identity (its lowest rank's ``run_start``, the GPUs it
reported), its events (the latest update of each episode, with what set it off) and its
invariants, and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire.protocol import fold_event_update, read_number
from tuimon.compare.curves import Curve
from tuimon.sink import Batch, Sink
from tuimon.store import THROUGHPUT_METRICS

#: The metrics whose curves are compared (the throughput is shown, not judged: see the report).
COMPARED_METRICS = ("loss", "grad_norm", "lr", *THROUGHPUT_METRICS)


@dataclass
class _Run:
    name: str
    starts: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    started_ts: float = 0.0
    points: dict[tuple[int, str], tuple[list[int], list[float]]] = field(default_factory=dict)
    events: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    invariants: dict[tuple[int, str], Mapping[str, Any]] = field(default_factory=dict)
    gpus: dict[int, dict[int, Mapping[str, Any]]] = field(default_factory=dict)
    ends: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    last_step: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """One run as a comparison sees it: ``where`` it came from, its lowest rank's ``start``
    (``run_start``), ``curves`` and ``end`` (``run_end``, None while it runs or when the recording
    stops short), the latest ``gpus`` reading of that rank by index, the ``events`` of every rank
    (the latest update of each episode, in the order they began) and the latest ``invariants``
    status of each rank and name."""

    name: str
    where: str
    rank: int
    ranks: tuple[int, ...]
    start: Mapping[str, Any] | None
    curves: Mapping[str, Curve]
    events: tuple[Mapping[str, Any], ...]
    invariants: Mapping[tuple[int, str], Mapping[str, Any]]
    gpus: Mapping[int, Mapping[str, Any]]
    end: Mapping[str, Any] | None
    last_step: int | None
    #: What the reader should know about how it was read (lines skipped, other runs left out).
    notes: tuple[str, ...] = ()

    @property
    def throughput(self) -> str | None:
        """The throughput metric the run reports (tokens a second before samples)."""
        return next((name for name in THROUGHPUT_METRICS if name in self.curves), None)


class RunCollector(Sink):
    """Keeps what :class:`RunRecord` needs of every run it is handed (recordings may hold several,
    one after another); :meth:`record` picks one. Messages must have been validated (decoded)."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self.malformed: list[str] = []

    def deliver(self, batch: Batch) -> None:
        for error, where in batch.malformed:
            self.malformed.append(f"{where}: {error}" if where else str(error))
        for message in batch.messages:
            self._take(message)

    @property
    def run_names(self) -> list[str]:
        return list(self._runs)

    def _take(self, message: Mapping[str, Any]) -> None:
        kind = message["type"]
        if kind in ("relay", "summary", "heartbeat"):
            return
        run = self._runs.get(message["run"])
        if run is None:
            run = self._runs[message["run"]] = _Run(message["run"], started_ts=message["ts"])
        rank = message["rank"]
        if kind == "run_start":
            run.starts[rank] = message
            run.started_ts = max(run.started_ts, message["ts"])
        elif kind == "metrics":
            step = message["step"]
            run.last_step[rank] = max(step, run.last_step.get(rank, step))
            for name in COMPARED_METRICS:
                value = read_number(message["metrics"].get(name))
                if value is not None:
                    steps, values = run.points.setdefault((rank, name), ([], []))
                    steps.append(step)
                    values.append(value)
        elif kind == "event":
            key = str(message.get("id") or f"{rank}-{message['seq']}")
            previous = run.events.get(key)
            if previous is None:
                run.events[key] = message
            elif (message.get("count") or 1) >= (previous.get("count") or 1):
                run.events[key] = fold_event_update(previous["message"], previous["details"], message)
        elif kind == "invariant":
            run.invariants[(rank, message["name"])] = message
        elif kind == "gpu":
            readings = run.gpus.setdefault(rank, {})
            for device in message["devices"]:
                readings[device["index"]] = device
        elif kind == "run_end":
            run.ends[rank] = message

    def record(self, where: str, run: str | None = None) -> RunRecord:
        """The run named ``run``, else the one that started last (a recording appended to by
        several runs); raises LookupError when there is no such run or no run at all."""
        if run is not None and run not in self._runs:
            heard = ", ".join(self._runs) or "none"
            raise LookupError(f"no run named {run!r} in {where} (runs: {heard})")
        if not self._runs:
            raise LookupError(f"no run in {where}")
        chosen = self._runs[run] if run is not None else max(self._runs.values(), key=lambda r: r.started_ts)
        notes = []
        others = [name for name in self._runs if name != chosen.name]
        if others:
            notes.append(f"{where} also holds {', '.join(others)}: compared {chosen.name}")
        if self.malformed:
            notes.append(f"{len(self.malformed)} malformed lines skipped, the first: {self.malformed[0]}")
        ranks = sorted(set(chosen.starts) | set(chosen.last_step) | {r for r, _ in chosen.points})
        rank = min(ranks) if ranks else 0
        curves = {
            name: Curve.of(*chosen.points[(rank, name)])
            for name in COMPARED_METRICS
            if (rank, name) in chosen.points
        }
        return RunRecord(
            name=chosen.name,
            where=where,
            rank=rank,
            ranks=tuple(ranks),
            start=chosen.starts.get(rank),
            curves=curves,
            events=tuple(chosen.events.values()),
            invariants=dict(chosen.invariants),
            gpus=dict(chosen.gpus.get(rank, {})),
            end=chosen.ends.get(rank),
            last_step=chosen.last_step.get(rank),
            notes=tuple(notes),
        )
