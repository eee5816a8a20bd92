"""The step's own work, told apart from the time it waits in the gradient all-reduce.

In synchronous data parallelism every rank's step takes the same time: the fast ranks wait inside
the all-reduce for the slowest one, so step times name no straggler (NVIDIA Resiliency Extension
and Megatron-LM's straggler detector time sections of the step for this reason). What differs is
when each rank's *own* work ends: at its last local gradient, after which it only waits for the
others. ``compute_time`` runs from the start of the step's own work to the end of its backward
pass: forward and backward compute (and whatever else the loop does before its last gradient),
without the exposed communication.

The end is marked by a callback the autograd engine runs when the backward pass has accumulated
every gradient (``Variable._execution_engine.queue_callback``, as DDP's reducer and FSDP finalise
their reductions). It is queued from a post-accumulate-grad hook
(``Tensor.register_post_accumulate_grad_hook``, PyTorch 2.1) on two trained parameters only: the
last one registered (usually the output layer's, whose gradient comes first) and the first one
(should the last get no gradient). Queued that early, it runs before DDP's own callback, which
waits for the all-reduce, so the wait is left out. A hook on every parameter would cost a call into
Python per parameter tensor and per backward, growing with the model (about 3.4 us a tensor on
this project's 2-core machine: 320 us a step for 98 tensors: docs/benchmarks.md); a hook removed later still
costs about 1.1 us a tensor, since torch keeps the C++ hook that walks the emptied hook dict.
Any number of these hooks may be registered and DDP's reducer is left alone; a DDP communication
hook, by contrast, can be registered only once (``DistributedDataParallel.register_comm_hook``),
so taking it would break a program that registers its own.

The step's own work starts when its first batch arrives (``Monitor.track_data``, ``tuimon run``'s
DataLoader hook; the waits for later micro-batches are taken off), else at the end of the
previous step less the step's data wait.

Marks are taken on the clock of the device that computes. On the CPU, the host clock. On a CUDA
device the host only queues kernels and races ahead, so a mark is a CUDA event recorded on the
current stream (``torch.cuda.Event``, as Megatron-LM's timers and NVRx's CUDA sections do; in the
engine's callback that is the stream backward was called on, which the engine has made wait for
every gradient's stream): the
interval is the device's own timeline. Events are read only once the device has passed them
(``Event.query``, never a sync), so the figure a step reports is that of the latest step the
device has finished, usually the one before. Parameters spread over several devices, or on other
devices, get no hooks and no ``compute_time``. A collective inside the forward (DDP's buffer
broadcast, FSDP's all-gathers) counts as compute.

A CUDA event costs the host about 13 us from Python (measured on an H200 host: creating and
recording one), two a step: on a ~1.5 ms step that alone was a fifth of the Monitor's whole budget for the
whole Monitor. On the host a mark is a clock read, but the end-of-pass callback that takes it is a
call queued on the autograd engine, from Python and back: 1.8 us a backward on warm caches on this
project's 2-core machine, more inside a real step (not resolved there: docs/benchmarks.md). So a step is
timed at most every :data:`TIMED_EVERY_S` on either clock (the steps between report none, and their
hooks return at once): the relay sends each rank's latest figure twice a second, and a straggler
is judged on the median of several, so 20 timed steps a second lose nothing.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import torch
from torch.autograd import Variable
from torch.utils.hooks import RemovableHandle

#: Steps whose device marks may wait to be reached. A host running further ahead of its device
#: skips the steps beyond: the oldest are reached first, so some figures keep coming.
PENDING_STEPS = 4
#: Least seconds between two timed steps.
TIMED_EVERY_S = 0.05


class Marks(Protocol):
    """Points on one device's timeline."""

    #: Least seconds between two timed steps (0: every step).
    every_s: float
    #: Whether a mark is the host's ``time.perf_counter()``, so that a step's end, read on the host,
    #: is the next step's start.
    host_clock: bool

    def mark(self) -> Any:
        """A point, now, in the order of the device's work; None where none can be taken."""

    def seconds_between(self, start: Any, end: Any) -> float | None:
        """Seconds from ``start`` to ``end``; None while the device has not reached ``end``."""


class HostMarks:
    """The host clock, for work done on the CPU: every mark is reached when it is taken."""

    every_s = TIMED_EVERY_S
    host_clock = True

    def mark(self) -> float:
        return time.perf_counter()

    def seconds_between(self, start: float, end: float) -> float | None:
        return end - start


class CudaMarks:
    """CUDA events on the current stream of one device, read without waiting for them."""

    every_s = TIMED_EVERY_S
    host_clock = False

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def mark(self) -> torch.cuda.Event | None:
        if torch.cuda.is_current_stream_capturing():  # an event cannot be timed inside a graph
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        return event

    def seconds_between(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float | None:
        if not (end.query() and start.query()):  # two streams: either may lag
            return None
        return start.elapsed_time(end) / 1000.0


def marks_for(params: Sequence[torch.Tensor]) -> Marks | None:
    """The clock of the one device holding ``params``; None for several devices or another kind."""
    devices = {param.device for param in params}
    if len(devices) != 1:
        return None
    (device,) = devices
    if device.type == "cpu":
        return HostMarks()
    if device.type == "cuda":
        return CudaMarks(device)
    return None


class Interval(NamedTuple):
    """One step's own work: from ``start`` to ``end`` on the device's clock, ``less`` the waits
    for later micro-batches (or the data wait) inside it."""

    start: Any
    end: Any
    less: float


#: One step's marks as the hooks leave them (:meth:`ComputeTimer.take`): its start (None for a step
#: not timed), its end (None until its backward pass ends), the waits for its later micro-batches,
#: and whether its first batch started it. A list, written in place by the hooks: on the training
#: thread, swapping one list for a fresh one costs less than resetting four attributes.
StepMarks = list[Any]


class ComputeTimer:
    """Hooks the trained parameters; :meth:`take` once per step on the training thread, then
    :meth:`reached` with what it gave on the step worker's, gives a compute time."""

    def __init__(self, choose_marks: Callable[[Sequence[torch.Tensor]], Marks | None] = marks_for,
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self._choose_marks = choose_marks
        self._on_error = on_error
        self._marks: Marks | None = None
        #: The marks' ``host_clock`` and ``every_s``, kept here: :meth:`take` reads them on every
        #: step, in place, where each object touched costs (``benchmarks/step_floor.py``).
        self._host_clock = False
        self._every_s = 0.0
        self._handles: dict[int, RemovableHandle] = {}
        #: Whether this backward pass has queued its end-of-pass callback yet.
        self._queued = False
        #: The marks of the step under way (:data:`StepMarks`).
        self._open: StepMarks = [None, None, 0.0, False]
        #: Intervals the device has not reached yet (the step worker's, as :meth:`reached` is).
        self._pending: deque[Interval] = deque()
        #: What broke a mark inside a hook (the backward pass must not fail for telemetry).
        self._failure: Exception | None = None
        #: Whether this step is timed (every step, unless the marks say otherwise), and when the
        #: latest timed one began.
        self._timing = True
        self._timed_at = -math.inf

    def watch(self, params: Sequence[torch.Tensor]) -> None:
        """The device's clock and two hooks, from ``params`` (the trained parameters, all of them
        each time: a later optimizer's may add hooks)."""
        marks = self._choose_marks(params)
        if marks is None:
            self.close()
            return
        self._marks, self._host_clock, self._every_s = marks, marks.host_clock, marks.every_s
        trained = [param for param in params if param.requires_grad]
        for param in trained[-1:] + trained[:1]:
            if id(param) not in self._handles:
                self._handles[id(param)] = param.register_post_accumulate_grad_hook(self._reached)

    def _reached(self, param: torch.Tensor) -> None:
        """A hooked gradient arrived: mark the end of this backward pass when it ends."""
        if self._queued or self._marks is None or not self._timing:
            return
        try:
            Variable._execution_engine.queue_callback(self._backward_done)
            self._queued = True
        except Exception as exc:
            self._failure, self._marks = exc, None

    def _backward_done(self) -> None:
        self._queued = False
        if self._marks is None:
            return
        try:
            self._open[1] = self._marks.mark()  # under gradient accumulation the last micro-batch's wins
        except Exception as exc:
            self._failure, self._marks = exc, None

    def batch_arrived(self, waited_s: float) -> None:
        """A batch reached the loop after ``waited_s``: the first of a step starts its own work;
        the waits for later ones (micro-batches) are not compute."""
        if self._marks is None or not self._timing:
            return
        step = self._open
        if step[3]:
            step[2] += waited_s
        else:
            step[0], step[3] = self._marks.mark(), True

    def take(self, at: float) -> StepMarks | None:
        """The step ends at ``at`` (training thread; ``time.perf_counter``): its marks, for
        :meth:`reached` on another thread; None where nothing is timed. The next step starts now
        (on the host clock: at ``at``), unless its first batch starts it; one not timed (the
        marks' ``every_s``) has no start.

        What broke a mark (in the backward pass, or here) goes once to ``on_error`` (raised
        without one) and ends the timing: the hooks are removed, and the step is not timed."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self._failed(failure)
            return None
        marks = self._marks
        if marks is None:
            return None
        taken = self._open
        # A backward pass that raised never ran its callback: the next one queues its own.
        self._queued = False
        if self._every_s:
            self._timing = at - self._timed_at >= self._every_s
            if self._timing:
                self._timed_at = at
        if self._host_clock:
            self._open = [at if self._timing else None, None, 0.0, False]
            return taken
        try:
            self._open = [marks.mark() if self._timing else None, None, 0.0, False]
        except Exception as exc:
            self._failed(exc)
            return None
        return taken

    def _failed(self, exc: Exception) -> None:
        self.close()
        if self._on_error is None:
            raise exc
        self._on_error("compute time", exc)

    def reached(self, taken: StepMarks | None, data_time: float | None) -> float | None:
        """The compute time of the latest step the device has finished (``taken``'s own on the
        CPU), or None while there is none; called once a step with what :meth:`take` gave and the
        step's data wait, in step order, by the step worker, so that the arithmetic and the device's
        event queries stay off the training thread. A step without a batch since the previous one
        is timed from that step's end, less ``data_time``."""
        marks, pending = self._marks, self._pending
        if marks is None:
            return None
        if taken is not None:
            start, end, later_waits, started_by_batch = taken
            if start is not None and end is not None:
                less = later_waits if started_by_batch else (data_time or 0.0)
                if not pending:  # nothing earlier on its way (always, on the host clock): this one alone
                    seconds = marks.seconds_between(start, end)
                    if seconds is None:
                        pending.append(Interval(start, end, less))
                        return None
                    return _own_seconds(seconds, less)
                if len(pending) < PENDING_STEPS:
                    pending.append(Interval(start, end, less))
        reached = None
        while pending:
            interval = pending[0]
            seconds = marks.seconds_between(interval.start, interval.end)
            if seconds is None:
                break
            pending.popleft()
            own = _own_seconds(seconds, interval.less)
            if own is not None:
                reached = own
        return reached

    def close(self) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        self._marks = None
        self._pending.clear()


def _own_seconds(seconds: float, less: float) -> float | None:
    """A step's own compute time: the ``seconds`` between its marks less the waits inside them
    (``less``), never below 0; None where the end mark reads before the start (no reading)."""
    return max(seconds - less, 0.0) if seconds >= 0 else None
