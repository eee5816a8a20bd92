"""Memory of the training process: host resident set size and the CUDA caching allocator's counters.

Read at a bounded rate (``interval_s``, default 0.1 s), not every step: the host reading is a
syscall (~10-20 us, so 0.02 % of a core at this rate). Ten readings a second let a leak of a few
megabytes a step be named within about a second (:class:`~publisher.detectors.speed.MemoryGrowth`).
The CUDA numbers come from the caching allocator's own bookkeeping (``torch.cuda.memory_allocated``
/ ``memory_reserved`` / ``max_memory_allocated``), which never synchronises with the GPU; they are
read only when this process has already initialised CUDA, so monitoring never creates a CUDA context
itself.

Metric names (bytes): ``host_mem_bytes``, ``cuda_mem_allocated`` (live tensors),
``cuda_mem_reserved`` (held by the allocator, what ``nvidia-smi`` shows for the process minus
the context), ``cuda_mem_peak`` (highest ``allocated`` since start or the last
``torch.cuda.reset_peak_memory_stats``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from publisher.collect import sysinfo

#: Host RSS is a syscall: read it at most this often, not every step.
DEFAULT_INTERVAL_S = 0.1


class MemoryReader:
    """Reads the process's memory when due. ``device`` gives the CUDA device the model lives on
    (None: the current device)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S,
                 device: Callable[[], torch.device | None] = lambda: None) -> None:
        if interval_s < 0:
            raise ValueError(f"memory interval must be >= 0 seconds, got {interval_s!r}")
        self.interval_s = interval_s
        self._device = device
        #: ``time.perf_counter()`` from which a reading is due (an attribute: read on every step).
        self.next_at = -math.inf

    def read(self, now: float) -> dict[str, float]:
        """The memory metrics now (the next reading is due ``interval_s`` later)."""
        self.next_at = now + self.interval_s
        values: dict[str, float] = {"host_mem_bytes": sysinfo.host_rss_bytes()}
        if torch.cuda.is_initialized():
            device = self._device()
            if device is None or device.type != "cuda":
                device = torch.device("cuda", torch.cuda.current_device())
            values["cuda_mem_allocated"] = torch.cuda.memory_allocated(device)
            values["cuda_mem_reserved"] = torch.cuda.memory_reserved(device)
            values["cuda_mem_peak"] = torch.cuda.max_memory_allocated(device)
        return values
