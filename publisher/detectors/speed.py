"""Detectors that read time and memory: throughput, slow steps, the input pipeline, leaks.

They read the step metrics ``step_time``, ``data_time``, ``samples_per_s`` / ``tokens_per_s``,
``host_mem_bytes`` and ``cuda_mem_allocated`` (see docs/protocol.md). Defaults follow SageMaker
Debugger's profiler rules (step outlier, CPU bottleneck, memory growth), as each class says.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence

import psutil

from publisher.detectors.base import Detector, Finding, Metrics, fmt, where
from publisher.measure.budget import StepClock
from publisher.readings.memory_cadence import DEFAULT_EVERY_STEPS, DEFAULT_INTERVAL_S
from publisher.wire.stall import pause_s, threshold_s

_MIB = 1024 * 1024


def leak_budget() -> float:
    """How much a leak may take before it must have been named: 1 GiB or a tenth of the memory
    this host has available now, whichever is less."""
    return min(1 << 30, 0.1 * psutil.virtual_memory().available)


def _rate(metrics: Metrics) -> tuple[str, float] | None:
    """The step's throughput: samples/s or tokens/s when known, else steps/s."""
    for name in ("samples_per_s", "tokens_per_s"):
        value = metrics.get(name)
        if value is not None and value > 0 and math.isfinite(value):
            return name, value
    step_time = metrics.get("step_time")
    if step_time is not None and step_time > 0 and math.isfinite(step_time):
        return "steps_per_s", 1.0 / step_time
    return None


class ThroughputDrop(Detector):
    """Training got slower and stayed slower: a sudden jump of the step time, or a halved throughput.

    - **A jump** (``jump``: 3x): every one of the latest steps took at least ``jump`` times the
      median of the ``baseline`` steps before them, for at least ``jump_steps`` (5) steps and
      ``jump_s`` (0.5 s).
    - **A drop** (``ratio``: 0.5): the median throughput of the last ``window`` (20) steps against
      that of the ``baseline`` (100) steps before them, the slow window lasting ``min_duration_s``
      (1 s). BLOOM lost 5 % to one slow GPU unnoticed (BigScience BLOOM-176B training
      chronicles); a halving is what is worth an alarm by default.
    - **Contention** (``contention``: 0.5): the training thread waited for a CPU at least half
      the time, in the median of the readings of the last ``contention_s`` (10 s).

    Judged once ``warmup`` (10) steps are past, on the loop's *own* time: the share spent waiting
    for a CPU (``cpu_wait``, :mod:`publisher.readings.cpu_wait`) is taken out of the step time.
    After ``baseline`` slow steps the slow level is the new normal and the episode ends. A step
    that holds a pause (:func:`publisher.wire.stall.pause_s`: half the stall threshold, 2.5 s at
    least; a validation pass, a checkpoint, a stall, which the stall events report) counts in none
    of the tests, nor does the CPU-wait reading that covers it. Why these tests and numbers, and
    what they were measured on: docs/detectors.md, "``throughput_drop``".
    """

    quiet_to_close = 20

    def __init__(self, window: int = 20, baseline: int = 100, ratio: float = 0.5, warmup: int = 10,
                 min_duration_s: float = 1.0, jump: float = 3.0, jump_steps: int = 5,
                 jump_s: float = 0.5, contention: float = 0.5, contention_s: float = 10.0) -> None:
        self.window = window
        self.ratio = ratio
        self.warmup = warmup
        self.min_duration_s = min_duration_s
        self.jump = jump
        self.jump_steps = jump_steps
        self.jump_s = jump_s
        self._seen = 0
        self._rates: deque[float] = deque(maxlen=window + baseline)
        self._times: deque[float] = deque(maxlen=window)
        self._unit = "steps_per_s"
        # The jump test: step times before the current streak, their median (refreshed every 10
        # steps), and the streak of steps over ``jump`` times it.
        self.baseline = baseline
        self._usual: deque[float] = deque(maxlen=baseline)
        self._usual_median = 0.0
        self._streak: list[float] = []
        self._streak_s = 0.0
        # Waiting for a CPU: the latest share (it holds until the next reading), and the recent
        # readings with the seconds each covers.
        self.contention = contention
        self.contention_s = contention_s
        self._wait = 0.0
        self._waits: deque[tuple[float, float]] = deque()
        self._waits_s = 0.0
        self._since_reading = 0.0
        # Pauses: the typical step they are measured against, and whether the CPU-wait reading to
        # come still covers one (a pause on a step that carried no reading).
        self._clock = StepClock()
        self._skip_reading = False

    def _reset_streak(self) -> None:
        self._streak = []
        self._streak_s = 0.0

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        if self._paused(metrics):
            return ()
        contended = self._contention(step, metrics)
        rate = _rate(metrics)
        if rate is None:
            return contended
        if rate[0] != self._unit:  # the user started passing samples or tokens: a new series
            self._unit = rate[0]
            self._rates.clear()
            self._usual.clear()
            self._reset_streak()
            self._usual_median = 0.0
        own = rate[1] / (1.0 - self._wait)  # the rate had the thread not waited for a CPU
        return (*contended, *(self._jump(step, 1.0 / own, metrics) or self._drop(step, own, metrics)))

    def _paused(self, metrics: Metrics) -> bool:
        """Whether this step holds a pause; if so, the CPU-wait reading that covers it is left out."""
        step_time = metrics.get("step_time")
        if step_time is None or not math.isfinite(step_time):
            return False
        paused = step_time >= pause_s(self._clock.seconds)
        self._clock.observe(step_time)
        if paused:
            self._since_reading = 0.0
            self._skip_reading = "cpu_wait" not in metrics
        return paused

    def _contention(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        step_time = metrics.get("step_time")
        if step_time is not None and math.isfinite(step_time):
            self._since_reading += step_time
        wait = metrics.get("cpu_wait")
        if wait is None or not math.isfinite(wait):
            return ()
        if self._skip_reading:  # it covers a pause
            self._skip_reading = False
            self._since_reading = 0.0
            return ()
        # Never all of it: a thread that waited 100 % of a reading still ran for its own part.
        self._wait = min(max(wait, 0.0), 0.95)
        covers, self._since_reading = self._since_reading, 0.0
        waits = self._waits
        waits.append((self._wait, covers))
        self._waits_s += covers
        while len(waits) > 1 and self._waits_s - waits[0][1] >= self.contention_s:
            self._waits_s -= waits.popleft()[1]
        if self._waits_s < self.contention_s:
            return ()
        median = statistics.median(share for share, _ in waits)
        if median < self.contention:
            return ()
        return (
            Finding(
                "throughput_drop",
                f"the training thread waited for a CPU {median:.0%} of the time over the last "
                f"{self._waits_s:.0f} s: other processes are taking the CPUs ({where(step, self.rank)})",
                {
                    "test": "cpu contention",
                    "cpu_wait": median,
                    "seconds": self._waits_s,
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "other jobs or processes on the node use the CPUs (top, htop: who is busy)",
                        "more DataLoader workers or torch threads than cores "
                        "(torch.get_num_threads(), num_workers)",
                        "a CPU quota (cgroup, container limits) below what the job uses",
                    ],
                },
                key="contention",
            ),
        )

    def _jump(self, step: int, cost: float, metrics: Metrics) -> Sequence[Finding]:
        """``cost``: seconds per unit of work (a sample, a token, else a step), so that a step doing
        more work at the same throughput (longer sequences) is no slowdown."""
        usual = self._usual
        if len(usual) >= self.warmup and (not self._usual_median or step % 10 == 0):
            self._usual_median = statistics.median(usual)
        median = self._usual_median
        if not median or cost < self.jump * median:
            if len(self._streak) < self.warmup:  # a short slow spell (a pause): part of normal
                usual.extend(self._streak)
            self._reset_streak()
            usual.append(cost)
            return ()
        streak = self._streak
        streak.append(cost)
        self._streak_s += metrics.get("step_time") or 0.0
        if len(streak) >= self.baseline and self._streak_s >= 2 * self.jump_s:  # slow for long: new normal
            usual.clear()
            usual.extend(streak)
            self._usual_median = statistics.median(usual)
            self._reset_streak()
            return ()
        if len(streak) < self.jump_steps or self._streak_s < self.jump_s:
            return ()
        now = statistics.median(streak)
        per = self._unit.removesuffix("s_per_s")
        return (
            Finding(
                "throughput_drop",
                f"training became {now / median:.0f}x slower: {fmt(now)} s per {per} over the last "
                f"{len(streak)} steps against {fmt(median)} s before ({where(step, self.rank)})",
                {
                    "metric": self._unit,
                    "recent": 1.0 / now,
                    "before": 1.0 / median,
                    "ratio": median / now,
                    "slower_by": now / median,
                    "slow_steps": len(streak),
                    "since_step": step - len(streak) + 1,
                    "data_time": metrics.get("data_time"),
                    "step_time": metrics.get("step_time"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "new per-step work in the loop: a debug routine, a .item() or print per step, "
                        "a synchronous logger or checkpoint",
                        "the input pipeline slowed down (check data_time; storage, workers, CPU)",
                        "another process took the CPUs or the GPUs (top, nvidia-smi)",
                        "GPU throttling (thermal or power) or a lower clock (see the GPU panel)",
                    ],
                },
            ),
        )

    def _drop(self, step: int, value: float, metrics: Metrics) -> Sequence[Finding]:
        self._seen += 1
        if self._seen <= self.warmup:
            return ()
        unit = self._unit
        self._rates.append(value)
        self._times.append(metrics.get("step_time") or 0.0)
        rates = self._rates
        if len(rates) < self.window * 2 or step % max(1, self.window // 4):
            return ()  # judged every few steps: medians cost more than the other detectors
        history = list(rates)
        recent = statistics.median(history[-self.window:])
        before = statistics.median(history[: -self.window])
        slow_for = math.fsum(self._times)
        if recent > self.ratio * before or slow_for < self.min_duration_s:
            return ()
        return (
            Finding(
                "throughput_drop",
                f"throughput fell to {recent / before:.0%} of its level: {fmt(recent)} "
                f"{unit.replace('_', ' ')} over the last {self.window} steps against {fmt(before)} before "
                f"({where(step, self.rank)})",
                {
                    "metric": unit,
                    "recent": recent,
                    "before": before,
                    "ratio": recent / before,
                    "window": self.window,
                    "baseline_steps": len(history) - self.window,
                    "data_time": metrics.get("data_time"),
                    "step_time": metrics.get("step_time"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "the input pipeline slowed down (check data_time; storage, workers, CPU)",
                        "another process shares the GPUs or CPUs (nvidia-smi, top)",
                        "GPU throttling (thermal or power) or a lower clock (see the GPU panel)",
                        "a slower phase of the run: longer sequences, more evaluation, synchronous logging",
                    ],
                },
            ),
        )


class StepTimeOutlier(Detector):
    """One step took far longer than usual: info (it is not a fault by itself).

    SageMaker's StepOutlier rule: step time above mean + 3 sigma. Here on robust statistics of
    the last ``window`` (100) normal steps (median, and sigma from the median absolute deviation,
    which one outlier does not inflate), after ``warmup`` (20) steps, and only when the step is
    also ``min_ratio`` (2) times the median and ``min_extra_s`` (0.5 s) longer: stalls a person
    notices, not scheduler noise. Evaluation pauses and checkpoints are such stalls; reported as
    ``info``, and a periodic one folds into one episode (``quiet_to_close`` 1000 steps). A step as
    long as the stall threshold (:func:`publisher.wire.stall.threshold_s` of the usual step) was
    already told while it lasted, by the stall events (``hang``, ``busy_pause``,
    ``collective_wait``), which close with its length: it is not told again when it ends.
    """

    quiet_to_close = 1000

    def __init__(self, window: int = 100, warmup: int = 20, z: float = 3.0, min_ratio: float = 2.0,
                 min_extra_s: float = 0.5) -> None:
        self.warmup = warmup
        self.z = z
        self.min_ratio = min_ratio
        self.min_extra_s = min_extra_s
        self._times: deque[float] = deque(maxlen=window)
        self._median = 0.0
        self._spread = 0.0

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        step_time = metrics.get("step_time")
        if step_time is None or not math.isfinite(step_time):
            return ()
        times = self._times
        if len(times) < self.warmup:
            times.append(step_time)
            return ()
        if step % 50 == 0 or not self._median:  # robust statistics, refreshed every 50 steps
            self._median = statistics.median(times)
            self._spread = 1.4826 * statistics.median(abs(t - self._median) for t in times)
        median = self._median
        limit = max(median + self.z * self._spread, self.min_ratio * median, median + self.min_extra_s)
        if step_time <= limit:
            times.append(step_time)
            return ()
        if step_time >= threshold_s(median):
            return ()  # a stall, told by the stall events while it lasted
        return (
            Finding(
                "step_time_outlier",
                f"step {step} took {fmt(step_time)} s, {step_time / median:.0f}x the usual {fmt(median)} s "
                f"({where(step, self.rank)})",
                {
                    "step_time": step_time,
                    "median": median,
                    "sigma": self._spread,
                    "data_time": metrics.get("data_time"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "an evaluation, checkpoint or logging pause inside the loop (expected if periodic)",
                        "waiting for data (a DataLoader worker restarting, a slow file)",
                        "a straggling rank in a collective, or a host-device synchronisation",
                    ],
                },
            ),
        )


class DataBottleneck(Detector):
    """Waiting for the next batch takes at least ``share`` (50 %) of the step, in most steps of a
    ``window`` (20).

    ``data_time`` (time blocked in the DataLoader, from ``Monitor.track_data`` or the zero-code
    hook) over ``step_time`` (wall time from one step to the next, which includes that wait);
    the median over the window, so that one slow batch (a worker restarting, a file opened)
    does not decide. At half the step the accelerator idles at least half the time: SageMaker's
    CPU-bottleneck rule looks for the same starvation from the GPU side (GPU < 10 % busy while
    the CPU is > 90 %). The first ``warmup`` (5) steps, while DataLoader workers start, do not
    count.
    """

    quiet_to_close = 20

    def __init__(self, share: float = 0.5, window: int = 20, warmup: int = 5) -> None:
        self.share = share
        self.window = window
        self.warmup = warmup
        self._seen = 0
        self._pairs: deque[tuple[float, float]] = deque(maxlen=window)

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        data_time, step_time = metrics.get("data_time"), metrics.get("step_time")
        if data_time is None or step_time is None or step_time <= 0:
            return ()
        self._seen += 1
        if self._seen <= self.warmup:
            return ()
        pairs = self._pairs
        pairs.append((data_time, step_time))
        if len(pairs) < self.window or data_time < self.share * step_time:
            return ()  # the median cannot be over the line if this step is not
        share = statistics.median(d / s for d, s in pairs)
        if share < self.share:
            return ()
        waited = statistics.fmean(d for d, _ in pairs)
        total = statistics.fmean(s for _, s in pairs)
        return (
            Finding(
                "data_bottleneck",
                f"waiting for data takes {share:.0%} of a typical step over the last {self.window} steps "
                f"({fmt(waited * 1000)} ms of {fmt(total * 1000)} ms on average, {where(step, self.rank)})",
                {
                    "data_share": share,
                    "data_time_mean": waited,
                    "step_time_mean": total,
                    "window": self.window,
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "too few DataLoader workers (num_workers) or no prefetching / pin_memory",
                        "slow storage or a network filesystem under load",
                        "expensive decoding or augmentation on the CPU (move it to the GPU or cache it)",
                        "the CPUs are shared with other jobs",
                    ],
                },
            ),
        )


class MemoryGrowth(Detector):
    """Host or CUDA memory rising in proportion to the steps: a leak, or an OOM on its way.

    Two series, each its own episode: ``host_mem_bytes`` (this process's resident set size) and
    ``cuda_mem_allocated`` (live tensors). Memory is news when it grows *with the steps*: a leak
    (a list of losses that keep their graphs, a DataLoader worker's batches kept alive) adds about
    the same bytes every step for as long as the loop runs. Two things look like it for a while
    and are not:

    - memory that swings: every batch a DataLoader worker hands over is a new shared-memory block
      mapped into this process, freed a few steps later, so the resident set saws up and down by
      tens of MiB. A leak raises the *floor*; so each series is read as floors, the lowest of
      every ``block`` (4) readings;
    - growth that stops: workers starting, prefetch queues, the allocator's arenas and caches
      filling, optimizer state created. It can climb steadily for tens of steps (100 MiB or more
      with persistent workers and a heavy model) before it stays flat, and while it climbs nothing
      tells it from a leak. What tells them apart is where it ends, so a climb is named only once
      it has taken a quarter of the *leak budget*: 1 GiB or a tenth of the host's available memory
      when the run started, whichever is less (a leak matters before the machine runs out, not
      in its first second). The quarter leaves the rest of the budget for the floors that the
      verdict waits for.

    Memory is read every 4 steps or 0.1 s, whichever is sooner (:mod:`publisher.readings.memory`;
    closer readings, from ``memory_interval_s=0``, are thinned to that cadence). After ``warmup``
    (20) steps a series fires when its floor has grown by that much (and at least ``min_bytes``)
    since its lowest floor, and the floors climb steadily: over the last ``window`` (5) floors, or
    over ``window`` floors spread evenly across the climb (a slow leak, whose neighbouring floors
    differ by less than their noise), they rose in all but one, and the second half grew at least
    ``keep_pace`` (3/4) as fast per step as the first (growth that slows down is settling).
    SageMaker Debugger's memory rule fires on +5 points of a moving average, which start-up
    alone exceeds; the budget is this detector's answer to that.
    """

    SERIES = ("host_mem_bytes", "cuda_mem_allocated")
    quiet_to_close = 10

    def __init__(self, warmup: int = 20, window: int = 5, block: int = 4, min_bytes: int = 32 * _MIB,
                 keep_pace: float = 0.75, budget_bytes: float | None = None, history: int = 600) -> None:
        if window < 4:
            raise ValueError("MemoryGrowth: window >= 4 floors")
        self.warmup = warmup
        self.window = window
        self.block = block
        self.min_bytes = min_bytes
        self.keep_pace = keep_pace
        self._budget = budget_bytes
        self._floors: dict[str, deque[tuple[int, float]]] = {
            name: deque(maxlen=history) for name in self.SERIES
        }
        self._blocks: dict[str, list[tuple[int, float]]] = {name: [] for name in self.SERIES}
        self._seen = 0
        self._since: list[float] = [0, 0.0]  # steps and seconds since the latest reading judged

    @property
    def budget_bytes(self) -> float:
        """The leak budget: 1 GiB or a tenth of the memory available when first asked."""
        if self._budget is None:
            self._budget = leak_budget()
        return self._budget

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        self._seen += 1
        self._since[0] += 1
        step_time = metrics.get("step_time")
        if step_time is not None and math.isfinite(step_time):
            self._since[1] += step_time
        if self._seen <= self.warmup:
            return ()
        if self._since[0] < DEFAULT_EVERY_STEPS and self._since[1] < DEFAULT_INTERVAL_S:
            return ()  # readings closer than the Monitor's cadence (memory read every step) are thinned
        findings = []
        for name in self.SERIES:
            value = metrics.get(name)
            if value is None or not math.isfinite(value):
                continue
            self._since = [0, 0.0]
            block = self._blocks[name]
            block.append((step, value))
            if len(block) < self.block:
                continue
            self._floors[name].append(min(block, key=lambda reading: reading[1]))
            block.clear()
            judged = self._judge(self._floors[name])
            if judged is not None:
                findings.append(self._finding(name, step, judged))
        return findings

    def _judge(self, floors: deque[tuple[int, float]]) -> tuple[int, float, float] | None:
        """(first step, first bytes, bytes per step) of a climb that is a leak, else None."""
        if len(floors) < self.window:
            return None
        lowest = min(range(len(floors)), key=lambda i: floors[i][1])
        if floors[-1][1] - floors[lowest][1] < max(self.min_bytes, self.budget_bytes / 4):
            return None
        climb = list(itertools.islice(floors, lowest, None))
        recent = list(itertools.islice(floors, len(floors) - self.window, None))
        spread = [climb[round(i * (len(climb) - 1) / (self.window - 1))] for i in range(self.window)]
        if not (self._steady(recent) or (len(climb) >= self.window and self._steady(spread))):
            return None
        (first_step, first), (last_step, last) = climb[0], climb[-1]
        return first_step, first, (last - first) / max(1, last_step - first_step)

    def _steady(self, floors: list[tuple[int, float]]) -> bool:
        """Did ``floors`` rise in all but one of their steps, and as fast late as early?"""
        values = [v for _, v in floors]
        if sum(b > a for a, b in itertools.pairwise(values)) < len(values) - 2:
            return False
        (first_step, first), middle, (last_step, last) = floors[0], floors[len(floors) // 2], floors[-1]
        early = (middle[1] - first) / max(1, middle[0] - first_step)
        late = (last - middle[1]) / max(1, last_step - middle[0])
        return early > 0 and late >= self.keep_pace * early

    def _finding(self, name: str, step: int, judged: tuple[int, float, float]) -> Finding:
        first_step, first, per_step = judged
        value = self._floors[name][-1][1]
        what = "host memory (RSS)" if name == "host_mem_bytes" else "CUDA memory allocated"
        return Finding(
            "memory_growth",
            f"{what} grows with every step: {value / _MIB:.0f} MiB, +{(value - first) / _MIB:.0f} MiB since "
            f"step {first_step}, about {per_step / _MIB:.2f} MiB per step ({where(step, self.rank)})",
            {
                "series": name,
                "bytes": value,
                "baseline_bytes": first,
                "baseline_step": first_step,
                "growth_bytes": value - first,
                "bytes_per_step": per_step,
                "leak_budget_bytes": self.budget_bytes,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "tensors that keep their autograd graph are stored across steps "
                    "(losses.append(loss) instead of loss.item(); outputs kept for metrics)",
                    "a cache or list that grows every step (logging buffers, a dict keyed by batch)",
                    "DataLoader workers growing by copy-on-write (Python objects in the Dataset)",
                    "CUDA: tensors kept in a global, or a growing KV cache / memory bank",
                ],
            },
            key=name,
        )
