"""Bring a step's small device tensors to the host in one copy, without stalling the training loop.

Reading a CUDA tensor (``loss.item()``) makes the CPU wait for everything queued on the GPU: one
such read per step removes the CPU's lead over the GPU and can cost more than the monitoring itself.
Here the tensors the steps want to report (loss, gradient norms, sampled statistics) are gathered
for up to :data:`GATHER_S`, then concatenated on their device and copied once to pinned host memory
with ``non_blocking=True``; a CUDA event marks the copy (:class:`HostValue`, shared with the
invariant checker). Each later call looks at the oldest copies and hands the ones that landed to
their callbacks, in submission order; nothing ever waits for the GPU unless ``MAX_IN_FLIGHT``
copies are outstanding (a loop that never synchronises) or at :meth:`DeviceFetch.drain` with
``wait``.

Why gather: from Python every CUDA call costs the host microseconds (measured on an H200 host:
a copy to pinned memory with its event 25-33 us, a ``torch.cat`` 10-12 us, any kernel launch
10-12 us, more while the device is busy), and one copy per step made ``Monitor.step`` cost 245 us
on a 1.5 ms step and 350 us on a 22 ms one (docs/benchmarks.md; with the compute-time sampling of
:mod:`publisher.readings.compute_time`, 50 and 88 us once gathered, measured before the join
below was added: one more kernel launch a step, 10-12 us there). A step's tensors are joined
on their device at once (one kernel, so that the values are those of the step: a CUDA graph's
next replay overwrites its outputs, as ``torch.compile(mode="reduce-overhead")`` documents, and a
loss may be changed in place), and the copy to the host is made once per :data:`GATHER_S`: a
figure reaches the step worker at most that much later, and the publisher hands its messages over
every 0.1 s anyway.

CPU tensors need none of this: their callbacks run at once, on the values in place.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import torch


class HostValue:
    """A small device tensor on its way to host memory, read only once it has arrived."""

    __slots__ = ("_event", "_host")

    _host: torch.Tensor
    _event: torch.cuda.Event | None  # None: already on the host

    def __init__(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        if tensor.device.type == "cuda":
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(tensor.device))
            self._host, self._event = host, event
        else:
            self._host, self._event = tensor.cpu(), None

    def ready(self) -> bool:
        if self._event is not None and self._event.query():
            self._event = None  # landed: :meth:`wait` then returns without calling into CUDA
        return self._event is None

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._host


Arrival = Callable[[list[torch.Tensor]], None]
_NOTHING = torch.empty(0)


#: Seconds a submission may wait to share one copy with later ones (see the module's docstring).
GATHER_S = 0.1
#: Submissions gathered into one copy at most (a bounded number of small tensors between copies).
GATHER_MAX = 64


class _Gathered(NamedTuple):
    """A submission set aside until the next copy: its device tensors, flattened and joined on
    their device (None: CPU numbers only), and how many numbers that is."""

    joined: torch.Tensor | None
    size: int
    reassemble: Callable[[torch.Tensor], None]


class DeviceFetch:
    """FIFO of tensor batches on their way to the host; callbacks run on the caller's thread."""

    #: Copies in flight beyond this make :meth:`submit` wait for the oldest (bounded memory).
    MAX_IN_FLIGHT = 64

    def __init__(self, gather_s: float = GATHER_S) -> None:
        #: Copies on their way, oldest first.
        self.queue: deque[tuple[HostValue, Callable[[torch.Tensor], None]]] = deque()
        #: Submissions waiting for the next copy, oldest first.
        self._gathered: list[_Gathered] = []
        self._gather_s = gather_s
        self._copied_at = -math.inf

    @property
    def pending(self) -> bool:
        """Whether any submission has not reached its callback yet (a cheap test for the hot path)."""
        return bool(self.queue or self._gathered)

    def submit(self, tensors: Sequence[torch.Tensor], on_arrival: Arrival) -> None:
        """Copy ``tensors`` (any shapes, one device) to the host; ``on_arrival(host_tensors)`` later.

        Device tensors arrive flattened, as float32, in the order given; CPU tensors are passed
        through as they are (a device batch never waits for them, nor they for it). When every
        tensor is on the CPU, ``on_arrival`` runs as soon as the submissions before it have landed.
        Tensors on several accelerators are gathered on the first one's.
        """
        kept = list(tensors)
        on_device = [i for i, t in enumerate(kept) if t.device.type != "cpu"]
        if not on_device and not self.pending:
            on_arrival(kept)
            return
        parts = [kept[i].detach().reshape(-1) for i in on_device]
        sizes = [part.numel() for part in parts]
        # One kernel: the values as they are now, whatever happens to the tensors before the copy.
        joined = torch.cat([part.to(parts[0].device) for part in parts]) if parts else None

        def reassemble(host: torch.Tensor) -> None:
            for i, part in zip(on_device, host.split(sizes), strict=True):
                kept[i] = part
            on_arrival(kept)

        self._gathered.append(_Gathered(joined, sum(sizes), reassemble))
        now = time.perf_counter()
        if now - self._copied_at >= self._gather_s or len(self._gathered) >= GATHER_MAX:
            self._copy(now)
        self.drain()

    def _copy(self, now: float) -> None:
        """One copy to the host of every gathered submission's tensors."""
        gathered, self._gathered = self._gathered, []
        self._copied_at = now
        parts = [submission.joined for submission in gathered if submission.joined is not None]
        if not parts:  # CPU numbers only, queued behind the copies before them to keep the order
            self.queue.append((HostValue(_NOTHING), partial(_deliver, gathered)))
        else:
            device = parts[0].device
            joined = torch.cat([part.to(device) for part in parts])  # torch.cat promotes the dtypes
            self.queue.append((HostValue(joined.to(torch.float32)), partial(_deliver, gathered)))
        while len(self.queue) > self.MAX_IN_FLIGHT:
            self._hand_over_oldest()

    def drain(self, wait: bool = False) -> None:
        """Hand over every copy that has landed (every submission, copying and waiting, when
        ``wait``)."""
        if wait and self._gathered:
            self._copy(time.perf_counter())
        queue = self.queue
        while queue and (wait or queue[0][0].ready()):
            self._hand_over_oldest()

    def _hand_over_oldest(self) -> None:
        value, deliver = self.queue.popleft()
        deliver(value.wait())


def _deliver(gathered: list[_Gathered], host: torch.Tensor) -> None:
    """Each gathered submission's share of one copy, to its callback, in submission order."""
    shares = host.split([submission.size for submission in gathered])
    for submission, share in zip(gathered, shares, strict=True):
        submission.reassemble(share)
