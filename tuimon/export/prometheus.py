"""The latest figures of every run heard, as Prometheus metrics.

Clusters already have Prometheus and Grafana; tuimon's place is to feed them, not to replace them.
:class:`LatestFigures` is a :class:`~tuimon.sink.Sink` (it hears exactly what a dashboard would,
from a publisher or a relay, snapshot first) that keeps only the latest value of each figure;
:class:`FiguresCollector` turns it into metric families when Prometheus scrapes, the "custom
collector" of prometheus_client's documentation ("Custom Collectors"), so nothing is computed
between scrapes and a series whose rank ended simply stops being reported.

Per rank (labels ``run``, ``rank``, ``host``): step, loss, learning rate, step time, data wait,
tokens and samples a second; per GPU (plus ``gpu``): utilisation, memory, temperature, power;
events counted by ``run``, ``kind`` and ``severity`` (one per episode: an event repeated while it
lasts keeps its ``id``; an episode that escalates, a ``hang`` turning critical, counts once more
at its new severity, so an alert on critical events hears it). Through a relay the per-rank
figures come from the nodes' summaries (step, loss, step time, data wait and GPUs; the rest are
not summarised). Names follow Prometheus' naming practice (base units, ``_total`` for counters).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from publisher.wire.protocol import ProtocolError, read_number
from tuimon.sink import Batch, Sink

#: (metric name in a ``metrics`` message or a summary's ``per_rank``, exported name, help).
RANK_FIGURES = (
    ("loss", "tuimon_loss", "Training loss at the rank's latest step."),
    ("lr", "tuimon_learning_rate", "Learning rate at the rank's latest step."),
    ("step_time", "tuimon_step_time_seconds", "Wall time of the rank's latest step."),
    ("data_time", "tuimon_data_wait_seconds", "Time the rank's latest step waited for its data."),
    ("compute_time", "tuimon_compute_seconds",
     "The rank's own work in its latest step, to its last gradient, without data or all-reduce waits."),
    ("tokens_per_s", "tuimon_tokens_per_second", "Tokens a second over the rank's latest step."),
    ("samples_per_s", "tuimon_samples_per_second", "Samples a second over the rank's latest step."),
)
#: (field of a GPU reading, exported name, help).
GPU_FIGURES = (
    ("util", "tuimon_gpu_utilization_percent", "GPU utilisation (NVML), percent."),
    ("mem_used", "tuimon_gpu_memory_used_bytes", "GPU memory in use (NVML)."),
    ("mem_total", "tuimon_gpu_memory_total_bytes", "GPU memory in all (NVML)."),
    ("temp_c", "tuimon_gpu_temperature_celsius", "GPU temperature (NVML)."),
    ("power_w", "tuimon_gpu_power_watts", "GPU power draw (NVML)."),
)
#: Episode ids remembered per run, so a repeated event is counted once (bounded whatever peers send).
MAX_EPISODES = 100_000

RankKey = tuple[str, int]  # (run, rank)


@dataclass
class _Rank:
    host: str
    step: int | None = None
    figures: dict[str, float] = field(default_factory=dict)
    gpus: dict[int, dict[str, float]] = field(default_factory=dict)  # device index -> readings


class LatestFigures(Sink):
    """What the exporter knows now; written by the receiver's thread, read by the scraper's.
    Notices and the source's status are not exported (``up`` of the scrape and the figures' own
    ages say as much), so only :meth:`deliver` is overridden."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranks: dict[RankKey, _Rank] = {}
        self.events: Counter[tuple[str, str, str]] = Counter()  # (run, kind, severity)
        self._episodes: dict[str, set[tuple[str, str]]] = {}  # run -> (id, severity) heard
        self.malformed: Counter[str] = Counter()

    # -------------------------------------------------------------------- Sink, receiver's thread

    def deliver(self, batch: Batch) -> None:
        with self._lock:
            for error, _ in batch.malformed:
                self.malformed[error.reason] += 1
            for message in batch.messages:
                self._apply(message)

    # ------------------------------------------------------------------------------------ applying

    def _rank(self, message: Mapping[str, Any], rank: int | None = None, host: str | None = None) -> _Rank:
        key = (message["run"], message["rank"] if rank is None else rank)
        state = self._ranks.get(key)
        if state is None:
            state = self._ranks[key] = _Rank(host or message["host"])
        return state

    def _apply(self, message: Mapping[str, Any]) -> None:
        msg_type = message["type"]
        if msg_type == "metrics":
            state = self._rank(message)
            state.step = message.get("step", state.step)
            state.figures.update(_numbers(message["metrics"]))
        elif msg_type == "gpu":
            state = self._rank(message)
            for device in message["devices"]:
                state.gpus[device["index"]] = _numbers(device)
        elif msg_type == "summary":
            self._apply_summary(message)
        elif msg_type == "event":
            self._count_event(message)
        elif msg_type == "run_end" and "by" not in message:
            self._ranks.pop((message["run"], message["rank"]), None)

    def _apply_summary(self, message: Mapping[str, Any]) -> None:
        """A node's ranks as its relay summarised them (:mod:`tuimon.relay.summary`)."""
        ranks, steps = message["ranks"], message.get("steps") or []
        per_rank = message.get("per_rank") or {}
        for i, number in enumerate(ranks):
            state = self._rank(message, number, message.get("node"))
            step = steps[i] if i < len(steps) else None
            if isinstance(step, int):
                state.step = step
            state.figures.update(_numbers({name: values[i] for name, values in per_rank.items()}))
        for device in message.get("gpus") or ():
            if not isinstance(device, dict) or device.get("rank") not in ranks:
                continue
            if isinstance(device.get("index"), int):
                self._rank(message, device["rank"]).gpus[device["index"]] = _numbers(device)

    def _count_event(self, message: Mapping[str, Any]) -> None:
        episode = message.get("id")
        if isinstance(episode, str):
            seen = self._episodes.setdefault(message["run"], set())
            heard = (episode, message["severity"])
            if heard in seen:
                return
            if len(seen) < MAX_EPISODES:
                seen.add(heard)
        self.events[(message["run"], message["kind"], message["severity"])] += 1

    # ------------------------------------------------------------------------- scraper's thread

    def families(self) -> list[Metric]:
        """Every metric family, made from one consistent look at the figures."""
        labels = ["run", "rank", "host"]
        with self._lock:
            ranks = sorted(self._ranks.items())
            step = GaugeMetricFamily("tuimon_step", "The rank's latest training step.", labels=labels)
            by_rank = _families(RANK_FIGURES, labels)
            by_gpu = _families(GPU_FIGURES, [*labels, "gpu"])
            for (run, rank), state in ranks:
                at = [run, str(rank), state.host]
                if state.step is not None:
                    step.add_metric(at, state.step)
                for name, value in state.figures.items():
                    if name in by_rank:
                        by_rank[name].add_metric(at, value)
                for index, readings in sorted(state.gpus.items()):
                    for name, value in readings.items():
                        if name in by_gpu:
                            by_gpu[name].add_metric([*at, str(index)], value)
            events = CounterMetricFamily(
                "tuimon_events", "Events heard (one per episode), by kind and severity.",
                labels=["run", "kind", "severity"],
            )
            for (run, kind, severity), count in sorted(self.events.items()):
                events.add_metric([run, kind, severity], count)
            malformed = CounterMetricFamily(
                "tuimon_malformed_messages", "Frames that were not valid tuimon messages, skipped.",
                labels=["reason"],
            )
            for reason, count in sorted(self.malformed.items()):
                malformed.add_metric([reason], count)
        return [step, *by_rank.values(), *by_gpu.values(), events, malformed]


class FiguresCollector:
    """A prometheus_client collector over :class:`LatestFigures` (registered with a registry)."""

    def __init__(self, figures: LatestFigures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        yield from self.figures.families()


def _families(figures: tuple[tuple[str, str, str], ...], labels: list[str]) -> dict[str, GaugeMetricFamily]:
    """An empty gauge family for each (field, exported name, help), by field."""
    return {name: GaugeMetricFamily(metric, text, labels=labels) for name, metric, text in figures}


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The numeric fields of ``values`` as floats (NaN and Inf as they came on the wire)."""
    out = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            continue
        try:
            number = read_number(value)
        except ProtocolError:
            continue
        if number is not None:
            out[name] = number
    return out
