"""Detectors that read the GPU samples (NVML or the simulated source): idle, unbalanced, throttled, failing.

Defaults follow SageMaker Debugger's profiler rules (low GPU utilisation, load balancing). GPUs are
the node's: only the process of local rank 0 samples them, so these run there only.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence

from publisher.detectors.base import Detector, Devices, Finding, where


class GpuImbalance(Detector):
    """One GPU far less busy than the others over a window of samples: a straggler or starved rank.

    Defaults: a GPU lags when its mean utilization over ``window`` (5) samples is at most
    ``ratio`` (0.5) of the median of the other GPUs' means, at least ``min_gap`` (25) points
    below it, while the others are busy (median >= ``min_busy``, 50 %). The 0.5 follows
    SageMaker's load-balancing rule (per-GPU utilization distributions differing by > 0.5);
    comparing each GPU with the others follows Megatron's min/max-with-rank straggler logging.
    Requiring busy peers keeps evaluation and checkpoint pauses (everyone idle) quiet.
    """

    quiet_to_close = 5

    def __init__(self, window: int = 5, ratio: float = 0.5, min_busy: float = 50.0, min_gap: float = 25.0):
        self.window = window
        self.ratio = ratio
        self.min_busy = min_busy
        self.min_gap = min_gap
        self._history: dict[int, deque[float]] = {}

    def observe_gpu(self, step: int | None, devices: Devices) -> Sequence[Finding]:
        for device in devices:
            util = device.get("util")
            if util is not None:
                self._history.setdefault(device["index"], deque(maxlen=self.window)).append(float(util))
        means = {i: statistics.fmean(h) for i, h in self._history.items() if len(h) == self.window}
        if len(means) < 2:
            return ()
        findings = []
        for index, util in means.items():
            median = statistics.median(v for i, v in means.items() if i != index)
            if median < self.min_busy or util > self.ratio * median or median - util < self.min_gap:
                continue
            findings.append(
                Finding(
                    "gpu_imbalance",
                    f"GPU {index} averaged {util:.0f}% busy over the last {self.window} samples while "
                    f"the other GPUs' median was {median:.0f}% ({where(step, self.rank)}): "
                    "it is waiting for work",
                    {
                        "index": index,
                        "util": util,
                        "median_others": median,
                        "samples": self.window,
                        "step": step,
                        "rank": self.rank,
                        "likely_causes": [
                            "the input pipeline feeding this GPU's rank is slower (workers, CPU, I/O)",
                            "uneven work: longer sequences or bigger batches on the other ranks",
                            "another process or a throttled clock on the other GPUs' side",
                            "a slow link (PCIe/NVLink) or CPU/NUMA affinity of this rank",
                        ],
                    },
                    key=index,
                )
            )
        return findings


class GpuThrottle(Detector):
    """A GPU reporting thermal or hardware throttling in ``min_samples`` (2) samples in a row.

    ``sw_power_cap`` is not reported by default: a busy H100 routinely sits at its power cap, and
    the driver lowering clocks to stay under it is the normal state of a full card, not a fault.
    Thermal slowdowns, hardware slowdown and the external power brake are. Megatron logs clock,
    power and temperature per rank for the same reason: a throttled GPU slows every rank.
    """

    REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
    quiet_to_close = 5

    def __init__(self, reasons: Iterable[str] = REASONS, min_samples: int = 2) -> None:
        self.reasons = frozenset(reasons)
        self.min_samples = min_samples
        self._streak: dict[int, int] = {}

    def observe_gpu(self, step: int | None, devices: Devices) -> Sequence[Finding]:
        findings = []
        for device in devices:
            index = device["index"]
            reasons = sorted(self.reasons.intersection(device.get("throttle") or ()))
            self._streak[index] = self._streak.get(index, 0) + 1 if reasons else 0
            if self._streak[index] < self.min_samples:
                continue
            findings.append(
                Finding(
                    "gpu_throttle",
                    f"GPU {index} is throttling ({', '.join(reasons)}) at {device.get('temp_c')} C, "
                    f"{device.get('sm_clock_mhz')} MHz, {device.get('power_w')} W "
                    f"of {device.get('power_limit_w')} W ({where(step, self.rank)})",
                    {
                        "index": index,
                        "reasons": reasons,
                        "temp_c": device.get("temp_c"),
                        "sm_clock_mhz": device.get("sm_clock_mhz"),
                        "power_w": device.get("power_w"),
                        "power_limit_w": device.get("power_limit_w"),
                        "step": step,
                        "rank": self.rank,
                        "likely_causes": [
                            "cooling: blocked airflow, a failed fan, hot aisle or room temperature",
                            "the node's power delivery asked for a brake (hw_power_brake: PSU/BMC)",
                            "hardware slowdown from the board (check nvidia-smi -q -d PERFORMANCE)",
                        ],
                    },
                    key=index,
                )
            )
        return findings


class GpuEcc(Detector):
    """New volatile uncorrected ECC errors on a GPU: critical.

    Any uncorrected error means the data on that GPU can no longer be trusted; memory faults were
    17 % of Llama 3 405B's interruptions and a daily event on OPT-175B (Llama 3 paper, 2024; OPT-175B
    logbook). Reported when the counter first shows errors and whenever it rises.
    """

    quiet_to_close = 10

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    def observe_gpu(self, step: int | None, devices: Devices) -> Sequence[Finding]:
        findings = []
        for device in devices:
            errors = device.get("ecc_errors")
            if errors is None:
                continue
            index = device["index"]
            before = self._seen.get(index, 0)
            self._seen[index] = errors
            if errors <= before:
                continue
            findings.append(
                Finding(
                    "gpu_ecc",
                    f"GPU {index} reports {errors} uncorrected ECC memory errors (+{errors - before}) "
                    f"({where(step, self.rank)}): its results can no longer be trusted",
                    {
                        "index": index,
                        "uuid": device.get("uuid"),
                        "ecc_errors": errors,
                        "new_errors": errors - before,
                        "step": step,
                        "rank": self.rank,
                        "likely_causes": [
                            "failing HBM: drain the node, check nvidia-smi -q -d ECC,ROW_REMAPPER",
                            "a pending page retirement / row remap that needs a GPU reset",
                        ],
                    },
                    key=index,
                )
            )
        return findings


class GpuLowUtil(Detector):
    """The node's GPUs are mostly idle while training runs: the job does not feed them.

    SageMaker's LowGPUUtilization profiler rule: the 95th percentile of utilization below
    ``p95`` (70 %) over a window (``window`` samples, 60: a minute at the default 1 Hz). Judged
    on samples taken while steps come: a sample counts when a step happened within
    ``max(idle_after_s, 3 x the usual time between steps)`` (2 s), so start-up before the first
    step (data loading, compilation), pauses (evaluation, checkpoints) and the end of the run,
    when the GPUs are idle by design, do not. GPUs this job does not use (0 % busy in every
    sample) are left out; one GPU idle among busy ones is :class:`GpuImbalance`'s. One finding
    for the node, naming the GPUs.
    """

    quiet_to_close = 10

    def __init__(self, p95: float = 70.0, window: int = 60, idle_after_s: float = 2.0) -> None:
        self.p95 = p95
        self.window = window
        self.idle_after_s = idle_after_s
        self._history: dict[int, deque[float]] = {}
        self._last_step: int | None = None
        self._step_at = 0.0
        self._interval: float | None = None

    def observe_gpu(self, step: int | None, devices: Devices) -> Sequence[Finding]:
        if not self._training(step, time.monotonic()):
            return ()
        for device in devices:
            util = device.get("util")
            if util is not None:
                self._history.setdefault(device["index"], deque(maxlen=self.window)).append(float(util))
        used = {i: h for i, h in self._history.items() if len(h) == self.window and max(h) > 0}
        if not used:
            return ()
        p95 = {i: statistics.quantiles(h, n=20, method="inclusive")[-1] for i, h in used.items()}
        if max(p95.values()) >= self.p95:
            return ()
        listing = ", ".join(f"GPU {i} {v:.0f}%" for i, v in sorted(p95.items()))
        return (
            Finding(
                "gpu_low_util",
                f"GPUs are mostly idle while training: 95th percentile of utilization over the last "
                f"{self.window} samples {listing} (below {self.p95:.0f}%, {where(step, self.rank)})",
                {
                    "p95": {str(i): v for i, v in p95.items()},
                    "threshold": self.p95,
                    "samples": self.window,
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "the input pipeline cannot keep up (check data_time / data_bottleneck)",
                        "batches too small for the GPU, or many small kernels (launch-bound: try larger "
                        "batches, torch.compile, CUDA graphs)",
                        "host-device synchronisations every step (.item(), .cpu(), printing tensors)",
                        "CPU-side work in the loop (logging, metrics, Python preprocessing)",
                    ],
                },
            ),
        )

    def _training(self, step: int | None, now: float) -> bool:
        """Whether steps are coming now (the same rule as the simulated source's load)."""
        if step is None:
            return False
        if step != self._last_step:
            if self._last_step is not None:
                gap = now - self._step_at
                self._interval = gap if self._interval is None else 0.8 * self._interval + 0.2 * gap
            self._last_step, self._step_at = step, now
        return now - self._step_at <= max(self.idle_after_s, 3 * (self._interval or 0.0))
