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
  spends outside the collectives. Each rank's median data wait is compared with the least
  waiting rank's (its input pipeline), then its median compute time (its own work up to its last
  gradient, without the all-reduce wait: :mod:`publisher.readings.compute_time`) with the fastest
  rank's (its device or host), and its median step time with the fastest rank's (which tells
  where ranks do not wait for each other): the relative score ``fastest / mine`` of NVIDIA
  Resiliency Extension's straggler detection, threshold 0.75. A compute straggler must also be
  slower by a share of the step (:data:`EXTRA_SHARE`), so that a millisecond of noise on a tiny
  step names nobody.

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
#: A rank's extra data wait or compute, as a share of the job's median step time, that makes it a
#: straggler.
EXTRA_SHARE = 0.25
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
    compute_times: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_WINDOW))


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
        was last heard, its step, where its training thread is, its step, data and compute times."""
        per_rank = message.get("per_rank", {})
        sampled = [
            (per_rank.get(name, []), into)
            for name, into in (("step_time", "step_times"), ("data_time", "data_times"),
                               ("compute_time", "compute_times"))
        ]
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
            for values, into in sampled:
                value = values[i] if i < len(values) else None
                if isinstance(value, int | float):
                    getattr(rank, into).append(float(value))

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
        timed = all(r.compute_times for r in sampled.values())
        compute = {n: statistics.median(r.compute_times) for n, r in sampled.items()} if timed else {}
        job_step, fastest = statistics.median(step.values()), min(step.values())
        least_wait = min(data.values())
        least_compute = min(compute.values()) if compute else 0.0
        findings = []
        for number, rank in sorted(sampled.items()):
            judged = _straggling(
                data[number] - least_wait,
                data[number],
                compute.get(number),
                least_compute,
                step[number],
                fastest,
                job_step,
            )
            if judged is None:
                continue
            cause, score, text = judged
            details: dict[str, Any] = {
                "rank": number,
                "host": rank.host,
                "cause": cause,
                "score": round(score, 3),
                "step_time_s": step[number],
                "fastest_step_time_s": fastest,
                "data_time_s": data[number],
                "least_data_time_s": least_wait,
            }
            if compute:
                details |= {"compute_time_s": compute[number], "least_compute_time_s": least_compute}
            message = f"rank {number} on {rank.host} is a straggler: {text}"
            findings.append(Finding(run, number, "straggler", "warning", message, details))
        return findings


def _straggling(
    extra_wait: float,
    wait: float,
    compute: float | None,
    least_compute: float,
    step: float,
    fastest: float,
    job_step: float,
) -> tuple[str, float, str] | None:
    """(cause, score, what to say) when one rank holds the job back, else None: its input pipeline
    first (data waits are told apart from compute, so "data on host X" and "slow device on host X"
    differ), then its own compute where it is known, then its step time (which tells where ranks
    do not wait for each other)."""
    if job_step > 0 and extra_wait > EXTRA_SHARE * job_step:
        score = (wait - extra_wait) / wait if wait > 0 else 1.0
        return "data", score, (
            f"waits {extra_wait * 1000:.0f} ms more per step for data than the least-waiting rank "
            f"({wait * 1000:.0f} ms): its input pipeline holds the job back"
        )
    if compute is not None:
        score = least_compute / compute if compute > 0 else 1.0
        if score < STRAGGLER_SCORE and compute - least_compute > EXTRA_SHARE * job_step:
            return "compute", score, (
                f"computes for {compute * 1000:.0f} ms a step against the fastest rank's "
                f"{least_compute * 1000:.0f} ms (score {score:.2f} < {STRAGGLER_SCORE}), the others "
                "waiting for it in the all-reduce: its device or host is slow"
            )
    score = fastest / step if step > 0 else 1.0
    if score < STRAGGLER_SCORE:
        return "step", score, (
            f"steps take {step * 1000:.0f} ms against the fastest rank's {fastest * 1000:.0f} ms "
            f"(score {score:.2f} < {STRAGGLER_SCORE})"
        )
    return None


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
