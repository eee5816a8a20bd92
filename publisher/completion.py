"""The step worker's half of a step: what the training thread captured, turned into its metrics.

The training thread records a step in :class:`~publisher.readings.step.StepReadings` and queues
it; what can wait happens here, on the step worker's thread (:mod:`publisher.threads.step_worker`),
in step order: throughput, the compute time (the device's marks read here:
:mod:`publisher.readings.compute_time`), host and CUDA memory and the training thread's wait for a
CPU (:mod:`publisher.readings.memory`, :mod:`publisher.readings.cpu_wait`), the device numbers that
arrived, which gradients went bad on a step whose norm is not finite, and the looks at the loss
calls (:mod:`publisher.patches.loss_look`: on the CPU, measured here). Moved here from the
training thread to cut the cost of watching (docs/benchmarks.md): there each read cost several times what it
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
from publisher.telemetry_errors import TelemetryErrors
from publisher.threads.thread_usage import native_id


class StepCompletion:
    """Completes each step the training thread queued (step worker thread, in step order).

    ``training_thread``: the :func:`threading.get_ident` of the thread that calls ``step()`` (the
    hang watchdog's), whose wait for a CPU is read. ``layers``: the per-layer sampler, once built,
    which names the gradients of a step whose norm is not finite. ``calls``: the Monitor's watch of
    the loss calls, which reads the looks a step took. Each part of a step (a device number, the
    step's timing, the compute time, the memory reading, the bad gradients' layout, each look) fails
    alone (:mod:`publisher.telemetry_errors`): it costs its own figures, and the step's ``failed``
    names it.
    """

    def __init__(self, timer: StepTimer, compute: ComputeTimer, memory: MemoryReader,
                 training_thread: Callable[[], int | None], errors: TelemetryErrors) -> None:
        self._timer = timer
        self._compute = compute
        self._memory = memory
        self._training_thread = training_thread
        self._cpu_wait = CpuWait(self._training_native_id)
        self._errors = errors
        self._step_timing = errors.part("step timing")
        self._compute_time = errors.part("compute time")
        self._memory_reading = errors.part("memory reading")
        self._layout = errors.part("gradient layout")
        self._look = errors.part("loss look")
        self.layers: LayerSampler | None = None
        self.calls: CallWatch | None = None

    def complete(self, readings: StepReadings) -> FinishedStep:
        """The step's metrics, from its readings."""
        step, metrics, failed = readings.step, readings.metrics, list(readings.failed)
        for (name, _), value in zip(readings.waiting, readings.values, strict=False):
            try:
                metrics[name] = float(value.item())
            except Exception as exc:  # a number of a kind the wire has not (complex): it alone is lost
                part = self._errors.part(f"metric {name!r}")
                part.failed(exc, step)
                failed.append(part.name)
        arrays = readings.values[len(readings.waiting):] if readings.waiting else readings.values
        self._timing(metrics, step, readings.at, readings.previous_at, readings.tokens, readings.samples,
                     readings.data_time, readings.compute, failed)
        grads, layout = readings.grads, readings.layout
        # Per-parameter gradient norms come first when there are any, then the sample's arrays.
        grad_norms, sample_arrays = (arrays[0], arrays[1:]) if grads is not None else (None, arrays)
        bad_gradients = grads is not None and not math.isfinite(metrics.get("grad_norm", 0.0))
        if layout is None and bad_gradients and self.layers is not None and self._layout.on:
            try:  # not a sampled step, but the gradients went bad: say which ones
                layout = self.layers.gradient_layout(grads)
            except Exception as exc:
                self._layout.failed(exc, step)
                failed.append(self._layout.name)
        looks = self.read_looks(readings.looks, step, failed)
        return FinishedStep(step, metrics, grad_norms, layout, sample_arrays, readings.batches, looks,
                            tuple(failed))

    def complete_quiet(self, quiet: QuietStep) -> tuple[dict[str, float], tuple[LossLook, ...],
                                                         tuple[str, ...]]:
        """A quiet step's metrics, the looks at its loss calls and the parts that failed, straight
        from its tuple: on the step worker, every object and call a step makes is paid by the
        training thread in waits for the GIL (``benchmarks/gil_share.py``), and a quiet step needs
        no :class:`StepReadings` to say what it holds."""
        step, at, previous_at, loss, lr, tokens, samples, data_time, compute, _, pending, extras = quiet
        if isinstance(lr, tuple):  # several parameter groups
            metrics = {} if loss is None else {"loss": loss}
            metrics.update(zip(lr_names(len(lr)), lr, strict=True))
        else:
            metrics = {"lr": lr} if loss is None else {"loss": loss, "lr": lr}
        if extras:  # as the full step: an extra with a standard name replaces the computed one
            metrics.update(extras)
        failed: list[str] = []
        self._timing(metrics, step, at, previous_at, tokens, samples, data_time, compute, failed)
        looks = self.read_looks(pending, step, failed) if pending else ()
        return metrics, looks, tuple(failed)

    def read_looks(self, pending: tuple[PendingLook, ...], step: int,
                   failed: list[str]) -> tuple[LossLook, ...]:
        """The looks at its loss calls a step took, read (on the CPU: measured here); one that
        cannot be read is left out, named in ``failed``."""
        calls, part = self.calls, self._look
        if not pending or calls is None or not part.on:
            return ()
        looks = []
        for look in pending:
            try:
                looks.append(calls.read(look))
            except Exception as exc:
                part.failed(exc, step)
                if part.name not in failed:
                    failed.append(part.name)
            else:
                part.ok()
        return tuple(looks)

    def close(self) -> None:
        """After the last step: the training thread's statistics file is closed."""
        self._cpu_wait.close()

    def _timing(self, metrics: dict[str, float], step: int, at: float, previous_at: float | None,
                tokens: int | None, samples: int | None, data_time: float | None, compute: StepMarks | None,
                failed: list[str]) -> None:
        """Step time and throughput since the previous step (observed by the step clock), the data
        wait, the compute time; memory and the wait for a CPU when they are due. Each of the three
        readings fails alone."""
        if data_time is not None:
            metrics["data_time"] = float(data_time)
        try:
            elapsed = self._timer.observe(at, previous_at)
            if elapsed is not None:
                metrics["step_time"] = elapsed
                if elapsed > 0:
                    if samples:
                        metrics["samples_per_s"] = float(samples) / elapsed
                    if tokens:
                        metrics["tokens_per_s"] = float(tokens) / elapsed
        except Exception as exc:
            self._step_timing.failed(exc, step)
            failed.append(self._step_timing.name)
        if self._compute_time.on:
            try:
                compute_time = self._compute.reached(compute, data_time)
            except Exception as exc:
                self._compute_time.failed(exc, step)
                failed.append(self._compute_time.name)
            else:
                self._compute_time.ok()
                if compute_time is not None:
                    metrics["compute_time"] = compute_time
        if self._memory.due(at) and self._memory_reading.on:
            try:
                metrics.update(self._memory.read(at))
                metrics.update(self._cpu_wait.read(at))
            except Exception as exc:
                self._memory_reading.failed(exc, step)
                failed.append(self._memory_reading.name)
            else:
                self._memory_reading.ok()

    def _training_native_id(self) -> int | None:
        """The kernel's id of the training thread, looked up at each reading (a few threads to scan,
        at most 50 times a second): a thread that replaces an ended one may reuse its ident."""
        ident = self._training_thread()
        return None if ident is None else native_id(ident)
