"""Job-level judgements a single rank cannot make: a rank lost, a hang, a straggler.

The root relay (or a node relay with nobody above it) sees every node's summary, which folds in
each rank's heartbeats (:mod:`tuimon.relay.summary`), so it is the one place that can compare
ranks live:

- **lost**: a rank (or a relay) whose heartbeats stop, heartbeats being sent every second whatever
  the training does, is lost after :data:`LOST_AFTER_S` without a ``run_end``; the event names its
  last step and when it was last heard (NVIDIA Resiliency Extension's fault tolerance treats
  missing heartbeats the same way, with much longer timeouts because it restarts the job).
- **hang**: heartbeats continue but the step stops advancing. One rank stuck while others advance
  is a hang of that rank; every rank stuck is a collective hang, and the rank whose training
  thread is *not* inside a collective (its heartbeat says, from the publisher's watchdog) is the
  one the others wait for, as PyTorch's Flight Recorder names the rank missing from a collective
  after the fact.
- **straggler**: in synchronous data parallelism every rank's step time is the same (the fast ranks
  wait inside the all-reduce), so step time names nobody there; what differs is the time a rank
  spends outside the collectives. Each rank's median data wait is compared with the job's, and,
  where ranks are not synchronised, its median step time with the fastest rank's: the relative
  score ``fastest / mine`` of NVIDIA Resiliency Extension's straggler detection, threshold 0.75.

Times are this process's monotonic clock at receipt, never the senders' timestamps (hosts' clocks
differ). Each finding is an ``event`` sent into the stream by the relay (``by`` names it), one
episode per (kind, rank): repeated while it lasts, closed when it ends.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire.protocol import numbered_by_sender

#: Seconds without a heartbeat (sent every second) before a rank or relay is lost.
LOST_AFTER_S = 5.0
#: A step that has not advanced for this long, or for ``HANG_STEPS`` typical steps if longer, is stuck.
HANG_AFTER_S = 5.0
HANG_STEPS = 10
#: NVIDIA Resiliency Extension's default straggler threshold on ``fastest / mine``.
STRAGGLER_SCORE = 0.75
#: A rank's extra data wait, as a share of the job's median step time, that makes it a straggler.
DATA_WAIT_SHARE = 0.25
#: Per-rank samples (one per summary, 2 a second) the straggler medians are taken over.
STRAGGLER_WINDOW = 10


@dataclass
class _Rank:
    host: str
    heard_at: float
    step: int | None = None
    step_at: float = 0.0
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    ended: bool = False
    in_collective: bool | None = None
    stack: list[str] | None = None
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_WINDOW))
    data_times: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_WINDOW))


@dataclass(frozen=True)
class Finding:
    """An event the watch wants sent: ``run``, ``rank`` it is about, and the event's fields."""

    run: str
    rank: int
    kind: str
    severity: str
    message: str
    details: dict[str, Any]


class JobWatch:
    """Fed decoded messages (summaries, run starts and ends, relay beats) by the relay's main
    thread; :meth:`check` returns what is wrong now."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[int, _Rank]] = {}
        self._relays: dict[str, tuple[str, float, set[str]]] = {}  # name -> (host, heard at, its runs)

    def observe(self, message: Mapping[str, Any], now: float) -> None:
        msg_type = message["type"]
        if msg_type == "relay":
            runs = {entry.get("run") for entry in message.get("ranks") or () if isinstance(entry, dict)}
            self._relays[message["run"]] = (
                message["host"],
                now,
                {run for run in runs if isinstance(run, str)},
            )
        elif msg_type == "summary":
            self._observe_summary(message, now)
        elif msg_type in ("run_start", "run_end") and numbered_by_sender(message):
            rank = self._rank(message["run"], message["rank"], message["host"], now)
            rank.heard_at = now
            rank.ended = msg_type == "run_end"

    def _rank(self, run: str, number: int, host: str, now: float) -> _Rank:
        ranks = self._runs.setdefault(run, {})
        rank = ranks.get(number)
        if rank is None:
            rank = ranks[number] = _Rank(host, now, step_at=now)
        rank.host = host
        return rank

    def _observe_summary(self, message: Mapping[str, Any], now: float) -> None:
        """One node's ranks as its relay last heard them (:mod:`tuimon.relay.summary`): when each
        was last heard, its step, where its training thread is, and its step and data times."""
        per_rank = message.get("per_rank", {})
        step_times, data_times = per_rank.get("step_time", []), per_rank.get("data_time", [])
        steps, beats = message.get("steps") or [], message.get("beats") or []
        for i, number in enumerate(message["ranks"]):
            rank = self._rank(message["run"], number, message["host"], now)
            beat = beats[i] if i < len(beats) and isinstance(beats[i], dict) else {}
            silent = beat.get("silent_s")
            heard_at = now - silent if isinstance(silent, int | float) else now
            rank.heard_at = max(rank.heard_at, heard_at)
            rank.in_collective = beat.get("in_collective")
            stack = beat.get("stack")
            rank.stack = stack if isinstance(stack, list) else None
            step = steps[i] if i < len(steps) else None
            if isinstance(step, int) and step != rank.step:
                if rank.step is not None and step > rank.step:
                    rank.intervals.append((now - rank.step_at) / (step - rank.step))
                rank.step, rank.step_at = step, now
            for values, into in ((step_times, rank.step_times), (data_times, rank.data_times)):
                value = values[i] if i < len(values) else None
                if isinstance(value, int | float):
                    into.append(float(value))

    # ------------------------------------------------------------------------------- judging

    def check(self, now: float) -> list[Finding]:
        findings: list[Finding] = []
        for run, ranks in self._runs.items():
            live = {n: r for n, r in ranks.items() if not r.ended}
            findings += self._lost(run, live, now)
            heard = {n: r for n, r in live.items() if now - r.heard_at <= LOST_AFTER_S}
            findings += self._hangs(run, heard, now)
            findings += self._stragglers(run, heard)
        for name, (host, heard_at, runs) in self._relays.items():
            if now - heard_at <= LOST_AFTER_S:
                continue
            findings += [
                Finding(
                    run,
                    0,
                    "rank_lost",
                    "critical",
                    f"relay {name} on {host} silent for {now - heard_at:.0f} s: the ranks behind "
                    "it are not seen",
                    {"relay": name, "host": host, "silent_s": round(now - heard_at, 1)},
                )
                for run in sorted(runs)
            ]
        return findings

    @staticmethod
    def _lost(run: str, live: dict[int, _Rank], now: float) -> list[Finding]:
        return [
            Finding(
                run,
                number,
                "rank_lost",
                "critical",
                f"rank {number} on {rank.host} silent for {now - rank.heard_at:.0f} s "
                f"(last step {rank.step if rank.step is not None else '-'}): its process or node may be gone",
                {
                    "rank": number,
                    "host": rank.host,
                    "last_step": rank.step,
                    "silent_s": round(now - rank.heard_at, 1),
                },
            )
            for number, rank in live.items()
            if now - rank.heard_at > LOST_AFTER_S
        ]

    @staticmethod
    def _stuck_after(rank: _Rank) -> float:
        typical = statistics.median(rank.intervals) if rank.intervals else 0.0
        return max(HANG_AFTER_S, HANG_STEPS * typical)

    def _hangs(self, run: str, heard: dict[int, _Rank], now: float) -> list[Finding]:
        stepping = {n: r for n, r in heard.items() if r.step is not None}
        stuck = {n: r for n, r in stepping.items() if now - r.step_at > self._stuck_after(r)}
        if not stuck:
            return []
        whole_job = len(stuck) == len(stepping)
        if whole_job and len(stuck) > 1:
            outside = [n for n, r in stuck.items() if r.in_collective is False]
            waiting = [n for n, r in stuck.items() if r.in_collective is True]
            named = outside or sorted(stuck)
            blame = (
                f"; rank {', '.join(map(str, outside))} is outside the collective the others wait in"
                if outside and waiting
                else ""
            )
            return [
                _hang(
                    run,
                    number,
                    stuck[number],
                    now,
                    True,
                    f"the whole job stopped at step {stuck[number].step} for "
                    f"{now - stuck[number].step_at:.0f} s (heartbeats continue){blame}",
                )
                for number in named
            ]
        return [
            _hang(
                run,
                number,
                rank,
                now,
                whole_job,
                f"rank {number} on {rank.host} stuck at step {rank.step} for {now - rank.step_at:.0f} s "
                "while other ranks advance (heartbeats continue)",
            )
            for number, rank in sorted(stuck.items())
        ]

    @staticmethod
    def _stragglers(run: str, heard: dict[int, _Rank]) -> list[Finding]:
        sampled = {n: r for n, r in heard.items() if len(r.step_times) >= STRAGGLER_WINDOW // 2}
        if len(sampled) < 2:
            return []
        step = {n: statistics.median(r.step_times) for n, r in sampled.items()}
        data = {n: statistics.median(r.data_times) if r.data_times else 0.0 for n, r in sampled.items()}
        job_step, fastest = statistics.median(step.values()), min(step.values())
        least_wait = min(data.values())
        findings = []
        for number, rank in sorted(sampled.items()):
            extra_wait = data[number] - least_wait
            score = fastest / step[number] if step[number] > 0 else 1.0
            if job_step > 0 and extra_wait > DATA_WAIT_SHARE * job_step:
                cause, text = (
                    "data",
                    (
                        f"waits {extra_wait * 1000:.0f} ms more per step for data than the "
                        f"least-waiting rank ({data[number] * 1000:.0f} ms): its input pipeline "
                        "holds the job back"
                    ),
                )
            elif score < STRAGGLER_SCORE:
                cause, text = (
                    "step",
                    (
                        f"steps take {step[number] * 1000:.0f} ms against the fastest rank's "
                        f"{fastest * 1000:.0f} ms (score {score:.2f} < {STRAGGLER_SCORE})"
                    ),
                )
            else:
                continue
            findings.append(
                Finding(
                    run,
                    number,
                    "straggler",
                    "warning",
                    f"rank {number} on {rank.host} is a straggler: {text}",
                    {
                        "rank": number,
                        "host": rank.host,
                        "cause": cause,
                        "score": round(score, 3),
                        "step_time_s": step[number],
                        "fastest_step_time_s": fastest,
                        "data_time_s": data[number],
                        "least_data_time_s": least_wait,
                    },
                )
            )
        return findings


def _hang(run: str, number: int, rank: _Rank, now: float, whole_job: bool, message: str) -> Finding:
    """A ``hang`` finding about one stuck rank, with its stack as its heartbeat last carried it."""
    return Finding(
        run,
        number,
        "hang",
        "critical",
        message,
        {
            "rank": number,
            "host": rank.host,
            "step": rank.step,
            "stuck_s": round(now - rank.step_at, 1),
            "whole_job": whole_job,
            "in_collective": rank.in_collective,
            "stack": rank.stack or [],
        },
    )
