"""Job-level judgements a single rank cannot make: a rank lost, who a stalled job waits for, a straggler.

The root relay (or a node relay with nobody above it) sees every node's summary, which folds in
each rank's heartbeats (:mod:`tuimon.relay.summary`), so it is the one place that can compare
ranks live:

- **lost**: a rank (or a relay) whose heartbeats stop, heartbeats being sent every second whatever
  the training does, is lost after :data:`LOST_AFTER_S` without a ``run_end``; the event names its
  last step and when it was last heard (NVIDIA Resiliency Extension's fault tolerance treats
  missing heartbeats the same way, with much longer timeouts because it restarts the job).
- **stalls**: heartbeats continue but the step stops advancing. Each rank is judged with the one
  definition of a stall (:func:`publisher.wire.stall.judge`: its threshold, and ``stuck``,
  ``busy`` or ``waiting`` in a collective) from the fields its heartbeats carry. The ranks waiting
  inside a collective wait for those outside it, which are the cause (PyTorch's Flight Recorder
  names "the rank missing from a collective" the same way after the fact; BigScience's BLOOM team
  found a hang as "6 processes in train, 2 in broadcast" with py-spy on every node:
  https://github.com/bigscience-workshop/bigscience/blob/master/train/tr11-176B-ml/hang-debug.md).
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

**One verdict per stall.** A rank whose publisher judges its own stalls (its heartbeats carry
``stall_after_s``) says them itself, at its threshold and with its stack: ``hang`` when it is
stuck, ``busy_pause``, ``collective_wait`` when it waits (:mod:`publisher.detectors.stall_events`). The
relay never repeats those. It says what takes more than one rank to know, or what a rank cannot
say:

- ranks wait in a collective for a rank outside it that judges itself: one ``info``
  ``collective_wait`` about that rank, naming who waits for it and where (its own ``hang`` is the
  verdict; this is the job's side of it);
- a rank outside the collective (or stalled alone) that does not judge itself (an older publisher,
  another implementation): its ``hang``, judged the same way (its threshold from the step
  intervals the relay saw), the ranks waiting for it in the details, so the first warning names
  the culprit with its host and function and nobody else;
- every rank of the run waits in a collective and none is outside it (nor lost): a ``hang``
  about the job (the collective itself hangs, or the rank it waits for is not watched), which no
  rank can say as each one only waits.

Waiting ranks are never called hung. Times are this process's monotonic clock at receipt, never the
senders' timestamps (hosts' clocks differ), except a beat's ``stalled_s``, which its node relay
brought up to the summary's time. Each finding is an ``event`` sent into the stream by the relay
(``by`` names it), one episode per (kind, rank): repeated while it lasts, closed when it ends.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from publisher.wire import stall
from publisher.wire.protocol import numbered_by_sender
from publisher.wire.stall import STUCK, WAITING, Stall

#: Seconds without a heartbeat (sent every second) before a rank or relay is lost.
LOST_AFTER_S = 5.0
#: Ranks named one by one in a finding's details (a job of thousands waiting is counted, and
#: said as ranges in its message).
LISTED_RANKS = 64
#: Characters of the ranges of ranks in a message (``0-1000, 1002-4095``).
RANGES_CHARS = 120
#: Seconds past its threshold a rank whose watchdog has not yet said where it is (an older
#: publisher reads its stack at the threshold, not before) is given for its stack to arrive: a
#: heartbeat (1 s), its node's summary (0.5 s), a round of the root's checks (0.5 s). Judged
#: before it, every rank of a job waiting for one would be called hung.
STACK_GRACE_S = 2.5
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
    #: Its watchdog's fields in the latest summary (``stalled_s`` as of ``beat_at``), and whether
    #: its publisher judges its own stalls (its heartbeats carried ``stall_after_s``).
    beat: dict[str, Any] = field(default_factory=dict)
    beat_at: float = 0.0
    judges_itself: bool = False
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
            rank.beat, rank.beat_at = {k: beat[k] for k in stall.BEAT_FIELDS if k in beat}, now
            rank.judges_itself = rank.judges_itself or "stall_after_s" in beat
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
            findings += self._stalls(run, heard, len(heard) < len(live), now)
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
    def _verdict(rank: _Rank, now: float) -> Stall:
        """The rank's stall as :func:`publisher.wire.stall.judge` reads its watchdog's fields now:
        seconds from its beat when it has them, else since the relay saw its step advance; its own
        threshold when it says it, else the same rule over the step intervals the relay saw."""
        stalled = rank.beat.get("stalled_s")
        if isinstance(stalled, int | float) and not isinstance(stalled, bool):
            seconds = float(stalled) + now - rank.beat_at
        else:
            seconds = now - rank.step_at
        threshold = None
        if not isinstance(rank.beat.get("stall_after_s"), int | float):
            threshold = stall.threshold_s(statistics.median(rank.intervals) if rank.intervals else None)
        return stall.judge({**rank.beat, "stalled_s": seconds}, threshold)

    def _stalls(self, run: str, heard: dict[int, _Rank], lost: bool, now: float) -> list[Finding]:
        """What the relay says of the run's stalled ranks (the rule: the module's docstring):
        ``lost``: some rank of the run is lost (the waiting ranks may wait for it)."""
        stepping = {n: r for n, r in heard.items() if r.step is not None}
        verdicts = {n: self._verdict(r, now) for n, r in stepping.items()}
        stalled = {n: v for n, v in verdicts.items() if v.stalled}
        if not stalled or any(_placeless(r, verdicts[n]) or _closing_in(verdicts[n])
                              for n, r in stepping.items()):
            return []  # where some rank is, or whether it steps again, will tell who waits for whom
        waiting = sorted(n for n, v in stalled.items() if v.state == WAITING)
        whole_job = len(stalled) == len(stepping)
        findings = []
        for number in sorted(n for n, v in stalled.items() if v.state != WAITING):
            rank, verdict = stepping[number], stalled[number]
            if verdict.state == STUCK and not rank.judges_itself:
                findings.append(_culprit(run, number, rank, verdict, waiting, stalled, whole_job))
            elif waiting:
                findings.append(_waited_for(run, number, rank, verdict, waiting, stalled))
        if waiting and len(waiting) == len(stepping) > 1 and not lost:
            findings.append(_all_waiting(run, waiting, stepping, stalled))
        return findings

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


def _placeless(rank: _Rank, verdict: Stall) -> bool:
    """Whether a stalled rank's watchdog should soon say where it is, and has not yet: its
    heartbeats carry ``stalled_s`` but no stack, and :data:`STACK_GRACE_S` has not passed."""
    return (verdict.stalled and not verdict.stack and "stalled_s" in rank.beat
            and verdict.stalled_s < verdict.threshold_s + STACK_GRACE_S)


def _closing_in(verdict: Stall) -> bool:
    """Whether a rank not yet stalled will be within :data:`STACK_GRACE_S` if it does not step: the
    ranks of a job stop together, but each node's summary brings their beats up at its own moment,
    so one node's ranks cross their thresholds a summary later than another's. Judged before they
    do, the first verdict would list only the waiting ranks of the faster node."""
    return not verdict.stalled and verdict.stalled_s >= verdict.threshold_s - STACK_GRACE_S


def _stall_details(number: int, rank: _Rank, verdict: Stall) -> dict[str, Any]:
    """What a stall finding says of the rank it is about (the fields of the rank's own events)."""
    return {
        "rank": number,
        "host": rank.host,
        "step": rank.step,
        "state": verdict.state,
        "stalled_s": round(verdict.stalled_s, 1),
        "threshold_s": round(verdict.threshold_s, 1),
        "where": verdict.where,
        "innermost": verdict.innermost,
        "in_collective": verdict.in_collective,
        "stack": list(verdict.stack),
    }


def _waiters(waiting: list[int], stalled: dict[int, Stall]) -> tuple[str, dict[str, Any]]:
    """`` in all_reduce (distributed_c10d.py:2800)``: where the waiting ranks wait (the most common
    innermost frame), and the details that list them (the first :data:`LISTED_RANKS`, and how many)."""
    places = Counter(stalled[n].innermost for n in waiting if stalled[n].innermost)
    place = places.most_common(1)[0][0] if places else None
    details = {"waiting_ranks": waiting[:LISTED_RANKS], "waiting": len(waiting), "waiting_in": place}
    return (f" in {place}" if place else ""), details


def _culprit(run: str, number: int, rank: _Rank, verdict: Stall, waiting: list[int],
             stalled: dict[int, Stall], whole_job: bool) -> Finding:
    """The ``hang`` of a stuck rank that does not judge itself, the ranks waiting for it in its details."""
    text = f"rank {number} on {rank.host} {verdict.describe()}"
    details = {**_stall_details(number, rank, verdict), "whole_job": whole_job}
    if waiting:
        place, listed = _waiters(waiting, stalled)
        text += f", outside the collective: {_who(waiting)} for it{place}"
        details |= listed
    elif not whole_job:
        text += " while other ranks advance"
    text += " (heartbeats continue)"
    return Finding(run, number, "hang", verdict.severity() or "warning", text, details)


def _waited_for(run: str, number: int, rank: _Rank, verdict: Stall, waiting: list[int],
                stalled: dict[int, Stall]) -> Finding:
    """The job's side of a rank's own stall verdict: who waits for it in a collective (``info``)."""
    place, listed = _waiters(waiting, stalled)
    text = (f"{_who(waiting)}{place} for rank {number} on {rank.host}, {verdict.describe()} outside the "
            "collective")
    return Finding(run, number, "collective_wait", "info", text,
                   {**_stall_details(number, rank, verdict), **listed})


def _all_waiting(run: str, waiting: list[int], ranks: dict[int, _Rank], stalled: dict[int, Stall]) -> Finding:
    """Every rank of the run waits in a collective and none is outside it: a ``hang`` of the job,
    about its lowest rank, ``critical`` once the shortest wait lasts as a stuck rank's would."""
    first = waiting[0]
    place, listed = _waiters(waiting, stalled)
    shortest = min(stalled[n].stalled_s for n in waiting)
    threshold = stalled[first].threshold_s
    severity = "critical" if shortest >= stall.CRITICAL_AFTER * threshold else "warning"
    text = (f"every rank ({_ranges(waiting)}) waits{place} for {shortest:.0f} s and none is outside the "
            "collective: it hangs itself (network, NCCL or gloo), or the rank it waits for is not watched")
    details = {**_stall_details(first, ranks[first], stalled[first]), "whole_job": True, **listed}
    return Finding(run, first, "hang", severity, text, details)


def _who(ranks: list[int]) -> str:
    """``rank 0 waits``, ``ranks 0, 2-7 wait``."""
    return f"rank {ranks[0]} waits" if len(ranks) == 1 else f"{len(ranks)} ranks ({_ranges(ranks)}) wait"


def _ranges(numbers: list[int]) -> str:
    """Ascending ranks as ranges, ``0, 2-4095``, cut to :data:`RANGES_CHARS` characters."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return text if len(text) <= RANGES_CHARS else text[: RANGES_CHARS - 1].rpartition(",")[0] + ", …"
