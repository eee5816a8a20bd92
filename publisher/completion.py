"""The step worker's half of a step: what the training thread captured, turned into its metrics.

The training thread records a step in :class:`~publisher.readings.step.StepReadings` and queues
it; what can wait happens here, on the step worker's thread (:mod:`publisher.threads.step_worker`),
in step order: throughput, the compute time (the device's marks read here:
:mod:`publisher.readings.compute_time`), host and CUDA memory and the training thread's wait for a
CPU (:mod:`publisher.readings.memory`, :mod:`publisher.readings.cpu_wait`), the device numbers that
arrived, which gradients went bad on a step whose norm is not finite, and the looks at the loss
calls (:mod:`publisher.patches.loss_look`: on the CPU, measured here). Moved here from the
training thread for issue 23 ("the cost of watching"): there each read cost several times what it
costs in a batch here, on warm caches. So is the typical step time
(:class:`~publisher.readings.timing.StepTimer`): the cost budgets on the training thread read it
one hand-off late, which a median of 31 steps does not notice.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from publisher.patches.loss_look import LossLook, PendingLook
from publisher.patches.torch_calls import CallWatch
from publisher.readings.compute_time import ComputeTimer, StepMarks
from publisher.readings.cpu_wait import CpuWait
from publisher.readings.memory import MemoryReader
from publisher.readings.step import QuietStep, StepReadings, lr_names
from publisher.readings.timing import StepTimer
from publisher.reporter import FinishedStep
from publisher.stats.sampler import LayerSampler
from publisher.threads.thread_usage import native_id


class StepCompletion:
    """Completes each step the training thread queued (step worker thread, in step order).

    ``training_thread``: the :func:`threading.get_ident` of the thread that calls ``step()`` (the
    hang watchdog's), whose wait for a CPU is read. ``layers``: the per-layer sampler, once built,
    which names the gradients of a step whose norm is not finite. ``calls``: the Monitor's watch of
    the loss calls, which reads the looks a step took.
    """

    def __init__(self, timer: StepTimer, compute: ComputeTimer, memory: MemoryReader,
                 training_thread: Callable[[], int | None]) -> None:
        self._timer = timer
        self._compute = compute
        self._memory = memory
        self._training_thread = training_thread
        self._cpu_wait = CpuWait(self._training_native_id)
        self.layers: LayerSampler | None = None
        self.calls: CallWatch | None = None

    def complete(self, readings: StepReadings) -> FinishedStep:
        """The step's metrics, from its readings."""
        metrics = readings.metrics
        for (name, _), value in zip(readings.waiting, readings.values, strict=False):
            metrics[name] = float(value.item())
        arrays = readings.values[len(readings.waiting):] if readings.waiting else readings.values
        self._timing(metrics, readings.at, readings.previous_at, readings.tokens, readings.samples,
                     readings.data_time, readings.compute)
        grads, layout = readings.grads, readings.layout
        # Per-parameter gradient norms come first when there are any, then the sample's arrays.
        grad_norms, sample_arrays = (arrays[0], arrays[1:]) if grads is not None else (None, arrays)
        if layout is None and grads is not None and self.layers is not None and not math.isfinite(
                metrics.get("grad_norm", 0.0)):
            # Not a sampled step, but the gradients went bad: say which ones.
            layout = self.layers.gradient_layout(grads)
        return FinishedStep(readings.step, metrics, grad_norms, layout, sample_arrays, readings.batches,
                            self.read_looks(readings.looks))

    def complete_quiet(self, quiet: QuietStep) -> dict[str, float]:
        """A quiet step's metrics, straight from its tuple: on the step worker, every object and
        call a step makes is paid by the training thread in waits for the GIL (issue 23), and a
        quiet step needs no :class:`StepReadings` to say what it holds."""
        _, at, previous_at, loss, lr, tokens, samples, data_time, compute, _, _, extras = quiet
        if isinstance(lr, tuple):  # several parameter groups
            metrics = {} if loss is None else {"loss": loss}
            metrics.update(zip(lr_names(len(lr)), lr, strict=True))
        else:
            metrics = {"lr": lr} if loss is None else {"loss": loss, "lr": lr}
        if extras:  # as the full step: an extra with a standard name replaces the computed one
            metrics.update(extras)
        self._timing(metrics, at, previous_at, tokens, samples, data_time, compute)
        return metrics

    def read_looks(self, pending: tuple[PendingLook, ...]) -> tuple[LossLook, ...]:
        """The looks at its loss calls a step took, read (on the CPU: measured here)."""
        calls = self.calls
        return tuple(calls.read(look) for look in pending) if pending and calls else ()

    def close(self) -> None:
        """After the last step: the training thread's statistics file is closed."""
        self._cpu_wait.close()

    def _timing(self, metrics: dict[str, float], at: float, previous_at: float | None, tokens: int | None,
                samples: int | None, data_time: float | None, compute: StepMarks | None) -> None:
        """Step time and throughput since the previous step (observed by the step clock), the data
        wait, the compute time; memory and the wait for a CPU when they are due."""
        elapsed = self._timer.observe(at, previous_at)
        if elapsed is not None:
            metrics["step_time"] = elapsed
            if elapsed > 0:
                if samples:
                    metrics["samples_per_s"] = float(samples) / elapsed
                if tokens:
                    metrics["tokens_per_s"] = float(tokens) / elapsed
        if data_time is not None:
            metrics["data_time"] = float(data_time)
        compute_time = self._compute.reached(compute, data_time)
        if compute_time is not None:
            metrics["compute_time"] = compute_time
        if self._memory.due(at):
            metrics.update(self._memory.read(at))
            metrics.update(self._cpu_wait.read(at))

    def _training_native_id(self) -> int | None:
        """The kernel's id of the training thread, looked up at each reading (a few threads to scan,
        at most 50 times a second): a thread that replaces an ended one may reuse its ident."""
        ident = self._training_thread()
        return None if ident is None else native_id(ident)
