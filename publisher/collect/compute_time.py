"""The step's own work, told apart from the time it waits in the gradient all-reduce.

In synchronous data parallelism every rank's step takes the same time: the fast ranks wait inside
the all-reduce for the slowest one, so step times name no straggler (NVIDIA Resiliency Extension
and Megatron-LM's straggler detector time sections of the step for this reason). What differs is
when each rank's *own* work ends: at its last local gradient, after which it only waits for the
others. A post-accumulate-grad hook on every trained parameter
(``Tensor.register_post_accumulate_grad_hook``, PyTorch 2.1) notes when the last one arrives, and
``compute_time`` is the time from the end of the previous step to that moment, less the step's
data wait: forward and backward compute (and whatever else the loop does before its last
gradient), without the exposed communication. Any number of these hooks may be registered and
DDP's reducer is left alone; a DDP communication hook, by contrast, can be registered only once
(``DistributedDataParallel.register_comm_hook``), so taking it would break a program that
registers its own.

Host clock only. On a CUDA device the hooks fire when the kernels are queued, not when they run,
so the figure would measure the host racing ahead of the device: parameters off the CPU get no
hooks and no ``compute_time`` (CUDA events would be the way there; not built). A collective inside
the forward (DDP's buffer broadcast, FSDP's all-gathers) counts as compute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch.utils.hooks import RemovableHandle


class ComputeTimer:
    """Hooks the trained parameters; :meth:`take` once per step gives that step's compute time."""

    def __init__(self) -> None:
        self._handles: dict[int, RemovableHandle] = {}
        self._last_grad_at: float | None = None

    def watch(self, params: Sequence[torch.Tensor]) -> None:
        """Hook ``params`` (the trained parameters, all of them each time: new ones are added).
        Where any lives off the CPU the host clock means nothing, so nothing is hooked."""
        if any(param.device.type != "cpu" for param in params):
            self.close()
            return
        for param in params:
            if id(param) not in self._handles and param.requires_grad:
                self._handles[id(param)] = param.register_post_accumulate_grad_hook(self._arrived)

    def _arrived(self, _param: torch.Tensor) -> None:
        self._last_grad_at = time.perf_counter()

    def take(self, previous_step_at: float | None, data_time: float | None) -> float | None:
        """Seconds from ``previous_step_at`` (the previous step's end, ``perf_counter``) to the
        latest gradient since, less ``data_time``; None when there is no previous step or no
        gradient arrived since it."""
        last, self._last_grad_at = self._last_grad_at, None
        if previous_step_at is None or last is None or last < previous_step_at:
            return None
        return max(last - previous_step_at - (data_time or 0.0), 0.0)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
