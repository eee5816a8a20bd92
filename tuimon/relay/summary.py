"""A node's ranks reduced to one ``summary`` message per run, twice a second.

Per-step metrics of every rank would swamp the root of a large job (4,096 ranks at 10 steps a
second is 40,000 messages a second before anyone looks at them), so a node relay reduces its
ranks' latest values: for each metric the minimum, median and maximum over the node's ranks, with
the ranks holding the minimum and the maximum (what Megatron-LM's straggler detector logs every
interval: ``MnRtt/Rnk``, ``MxRtt/Rnk``), plus the per-rank figures a job view draws and judges
(step, step time, data wait, compute time) and the latest reading of each GPU. A viewer that drills into one
rank subscribes to that rank's full stream instead (:mod:`publisher.wire.topics`).

Each rank's heartbeat is folded in too (``beats``: seconds since it was last heard, and what its
watchdog says of its training thread, the fields :func:`publisher.wire.stall.judge` reads), so the
relay at the top of the tree judges liveness and stalls from two summaries a node a second rather
than from one heartbeat a rank a second: the root of 512 nodes decodes 1,000 messages a second,
not 5,000. The heartbeats themselves still pass through for any viewer that subscribes to them.
A beat's ``stalled_s`` is brought up to the summary's time (0 once a newer step's metrics came),
and its stack is cut to what a verdict reads (the innermost frame of user code and the innermost
frame) except for a few ranks outside a collective (:data:`WHOLE_STACKS`), the ones a hang is
about: the stacks of a node of many ranks waiting in a collective would not fit a summary.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire import stall
from publisher.wire.protocol import read_number, wire_number

#: Seconds between two summaries of a run (2 Hz).
DEFAULT_PERIOD_S = 0.5
#: Figures a rank measures on some steps only, which stay its latest until a newer one comes (for up
#: to :data:`KEEP_S`): a step's ``compute_time`` is timed at most every 50 ms
#: (:mod:`publisher.readings.compute_time`), so on fast steps most metrics carry none, and a summary
#: of the newest alone would mostly have none.
SOME_STEPS = ("compute_time",)
#: Seconds a figure of :data:`SOME_STEPS` stays a rank's latest without a newer one (40 of its
#: periods): one whose measuring stopped (a failed timer ends it) is not judged on a stale figure.
KEEP_S = 2.0
#: Per-rank figures each summary carries, aligned with its ``ranks`` (None where a rank has none).
PER_RANK = ("step_time", "data_time", "compute_time", "loss")
#: GPU readings each summary carries per device.
GPU_FIELDS = ("util", "mem_used", "mem_total", "temp_c", "power_w", "sm_clock_mhz")
#: Ranks of a summary whose whole stack it carries (those outside a collective first); at about
#: 6 KB a stack, a summary of a node of any size stays well within its 256 KiB.
WHOLE_STACKS = 8


@dataclass
class _RankLatest:
    host: str
    heard_at: float
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    gpus: list[Mapping[str, Any]] = field(default_factory=list)
    #: What its latest heartbeat said of its training thread (:data:`publisher.wire.stall.BEAT_FIELDS`),
    #: and when it came; ``stalled_s`` is reset to 0 when a newer step's metrics come.
    watchdog: dict[str, Any] = field(default_factory=dict)
    watchdog_at: float = 0.0
    #: When each of its :data:`SOME_STEPS` figures came.
    measured_at: dict[str, float] = field(default_factory=dict)


@dataclass
class _RunLatest:
    ranks: dict[int, _RankLatest] = field(default_factory=dict)
    changed: bool = False


class NodeSummarizer:
    """Keeps the latest metrics and GPU readings of each (run, rank) it is shown, and makes the
    summaries. Single-threaded: the relay's main thread feeds it and asks for summaries."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._runs: dict[str, _RunLatest] = {}

    def observe(self, message: Mapping[str, Any], now: float) -> None:
        """A decoded ``metrics``, ``gpu``, ``heartbeat`` or ``run_end`` message of one of the node's
        ranks, received at ``now`` (this process's monotonic clock)."""
        msg_type, run_name = message["type"], message["run"]
        if msg_type == "run_end":
            run = self._runs.get(run_name)
            if run is not None:
                run.ranks.pop(message["rank"], None)
                if not run.ranks:
                    del self._runs[run_name]
            return
        run = self._runs.setdefault(run_name, _RunLatest())
        rank = run.ranks.get(message["rank"])
        if rank is None:
            rank = run.ranks[message["rank"]] = _RankLatest(message["host"], now)
        rank.heard_at = now
        step = message.get("step")
        if isinstance(step, int) and (rank.step is None or step > rank.step):
            rank.step = step
            if msg_type == "metrics" and "stalled_s" in rank.watchdog:  # it stepped since its heartbeat
                rank.watchdog = {k: v for k, v in rank.watchdog.items() if k == "stall_after_s"}
                rank.watchdog["stalled_s"], rank.watchdog_at = 0.0, now
        if msg_type == "heartbeat":
            rank.watchdog = {name: message[name] for name in stall.BEAT_FIELDS if name in message}
            rank.watchdog_at = now
        elif msg_type == "metrics":
            numbers = ((name, read_number(value)) for name, value in message["metrics"].items())
            latest = {name: number for name, number in numbers if number is not None}
            for name in SOME_STEPS:
                if name in latest:
                    rank.measured_at[name] = now
                elif name in rank.metrics and now - rank.measured_at[name] <= KEEP_S:
                    latest[name] = rank.metrics[name]
            rank.metrics = latest
        elif msg_type == "gpu":
            rank.gpus = message["devices"]
        run.changed = True

    def summaries(self, now: float) -> list[tuple[str, int, dict[str, Any]]]:
        """(run, lowest rank, body) of a ``summary`` for each run with news since the last call (a
        rank that falls silent while others still beat stays in, its silence growing)."""
        made = []
        for name, run in self._runs.items():
            if not run.changed:
                continue
            run.changed = False
            ranks = sorted(run.ranks)
            made.append((name, ranks[0], self._summary(ranks, run, now)))
        return made

    def _summary(self, ranks: list[int], run: _RunLatest, now: float) -> dict[str, Any]:
        latest = [run.ranks[rank] for rank in ranks]
        names = sorted({name for rank in latest for name in rank.metrics})
        return {
            "node": self.node,
            "ranks": ranks,
            "steps": [rank.step for rank in latest],
            "metrics": {name: spread(ranks, [rank.metrics.get(name) for rank in latest]) for name in names},
            "per_rank": {name: [wire_number(rank.metrics.get(name)) for rank in latest] for name in PER_RANK},
            "gpus": [
                {
                    "rank": number,
                    "index": device.get("index"),
                    **{key: device.get(key) for key in GPU_FIELDS if key in device},
                }
                for number, rank in zip(ranks, latest, strict=True)
                for device in rank.gpus
            ],
            "beats": _beats(latest, now),
        }


def _beats(latest: list[_RankLatest], now: float) -> list[dict[str, Any]]:
    """What the job watch needs of each rank's heartbeats: how long since it was heard, and its
    watchdog's fields, ``stalled_s`` as of now, whole stacks for the first :data:`WHOLE_STACKS`
    ranks outside a collective."""
    outside = [rank for rank in latest
               if rank.watchdog.get("stack") and rank.watchdog.get("in_collective") is not True]
    whole = {id(rank) for rank in outside[:WHOLE_STACKS]}
    beats = []
    for rank in latest:
        beat: dict[str, Any] = {"silent_s": round(max(now - rank.heard_at, 0.0), 2), **rank.watchdog}
        stalled = rank.watchdog.get("stalled_s")
        if isinstance(stalled, int | float):
            beat["stalled_s"] = round(stalled + max(now - rank.watchdog_at, 0.0), 2)
        stack = beat.get("stack")
        if isinstance(stack, list) and id(rank) not in whole:
            beat["stack"] = cut_stack(stack)
        beats.append(beat)
    return beats


def cut_stack(stack: list[str]) -> list[str]:
    """The entries a verdict reads (:func:`publisher.wire.stall.judge`): the innermost frame of
    user code and the innermost frame, in their order."""
    user = next((entry for entry in reversed(stack)
                 if (frame := stall.parse_entry(entry)) is not None and frame.user), None)
    inner = stack[-1:]
    return [user, *inner] if user is not None and inner != [user] else inner


def spread(ranks: list[int], values: list[float | None]) -> dict[str, Any]:
    """Minimum, median and maximum of the finite values, with the ranks holding the extremes, and
    the ranks whose value is not finite (a NaN loss on one rank is news on its own)."""
    finite = [
        (value, rank)
        for rank, value in zip(ranks, values, strict=True)
        if value is not None and math.isfinite(value)
    ]
    nonfinite = [
        rank
        for rank, value in zip(ranks, values, strict=True)
        if value is not None and not math.isfinite(value)
    ]
    if not finite:
        return {"nonfinite_ranks": nonfinite}
    low, high = min(finite), max(finite)
    return {
        "min": low[0],
        "min_rank": low[1],
        "median": statistics.median(v for v, _ in finite),
        "max": high[0],
        "max_rank": high[1],
        "nonfinite_ranks": nonfinite,
    }
