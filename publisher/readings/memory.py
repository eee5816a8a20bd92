"""Memory of the training process: host resident set size and the CUDA caching allocator's counters.

Read every ``interval_s`` (0.1 s), or every ``every_steps`` (4) steps if that is sooner but not
sooner than ``min_interval_s`` (0.02 s): at most 50 readings a second. The host reading is one
``pread`` (~1 us) and the CUDA counters are the allocator's own bookkeeping. Ten readings a
second let a leak of a few megabytes a step be named within about a second, and a reading every
few steps lets a short run of slower steps (a 60-step debug run) be judged at all
(:class:`~publisher.detectors.speed.MemoryGrowth`). The CUDA numbers never synchronise with the
GPU; they are read only when this process has already initialised CUDA, so monitoring never
creates a CUDA context itself. They are read from one ``torch.cuda.memory_stats_as_nested_dict``:
``torch.cuda.memory_allocated`` and its siblings each flatten the allocator's whole table in
Python (about 140 us a call, measured on an H200 host: over 400 us of the step worker's hold on
the GIL for the three, ten times a second).

Metric names (bytes): ``host_mem_bytes``, ``cuda_mem_allocated`` (live tensors),
``cuda_mem_reserved`` (held by the allocator, what ``nvidia-smi`` shows for the process minus
the context), ``cuda_mem_peak`` (highest ``allocated`` since start or the last
``torch.cuda.reset_peak_memory_stats``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from publisher.readings import sysinfo
from publisher.readings.memory_cadence import DEFAULT_EVERY_STEPS, DEFAULT_INTERVAL_S

#: Memory is read at least every DEFAULT_INTERVAL_S, and every DEFAULT_EVERY_STEPS steps when that
#: is sooner, but not sooner than this.
MIN_INTERVAL_S = 0.02


class MemoryReader:
    """Reads the process's memory when due. ``device`` gives the CUDA device the model lives on
    (None: the current device)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S,
                 device: Callable[[], torch.device | None] = lambda: None,
                 every_steps: int = DEFAULT_EVERY_STEPS) -> None:
        if interval_s < 0:
            raise ValueError(f"memory interval must be >= 0 seconds, got {interval_s!r}")
        self.interval_s = interval_s
        self.every_steps = every_steps
        self._device = device
        self._next_at = -math.inf
        self._read_at = -math.inf
        self._steps_left = 0

    def due(self, now: float) -> bool:
        """Is a reading due at this step (called once a step)?"""
        self._steps_left -= 1
        return now >= self._next_at or (
            self._steps_left <= 0 and now - self._read_at >= min(MIN_INTERVAL_S, self.interval_s))

    def read(self, now: float) -> dict[str, float]:
        """The memory metrics now (the next is due ``interval_s`` or ``every_steps`` later)."""
        self._read_at = now
        self._next_at = now + self.interval_s
        self._steps_left = self.every_steps
        values: dict[str, float] = {"host_mem_bytes": sysinfo.host_rss_bytes()}
        if torch.cuda.is_initialized():
            device = self._device()
            if device is None or device.type != "cuda":
                device = torch.device("cuda", torch.cuda.current_device())
            stats = torch.cuda.memory_stats_as_nested_dict(device)
            allocated = stats.get("allocated_bytes", {}).get("all", {})
            values["cuda_mem_allocated"] = allocated.get("current", 0)
            values["cuda_mem_reserved"] = stats.get("reserved_bytes", {}).get("all", {}).get("current", 0)
            values["cuda_mem_peak"] = allocated.get("peak", 0)
        return values
