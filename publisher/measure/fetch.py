"""Bring a step's small device tensors to the host in one copy, without stalling the training loop.

Reading a CUDA tensor (``loss.item()``) makes the CPU wait for everything queued on the GPU: one
such read per step removes the CPU's lead over the GPU and can cost more than the monitoring itself.
Here the tensors a step wants to report (loss, gradient norms, sampled statistics) are concatenated
on their device and copied once to pinned host memory with ``non_blocking=True``; a CUDA event marks
the copy (:class:`HostValue`, shared with the invariant checker). Each later call looks at the
oldest copies and hands the ones that landed to their callbacks, in submission order; nothing ever
waits for the GPU unless ``MAX_IN_FLIGHT`` steps are outstanding (a loop that never synchronises) or
at :meth:`DeviceFetch.drain` with ``wait``.

CPU tensors need none of this: their callbacks run at once, on the values in place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

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


class DeviceFetch:
    """FIFO of tensor batches on their way to the host; callbacks run on the caller's thread."""

    #: Batches in flight beyond this make :meth:`submit` wait for the oldest (bounded memory).
    MAX_IN_FLIGHT = 64

    def __init__(self) -> None:
        #: Batches on their way, oldest first (truthy while any is: a cheap test for the hot path).
        self.queue: deque[tuple[HostValue, Callable[[torch.Tensor], None]]] = deque()

    def submit(self, tensors: Sequence[torch.Tensor], on_arrival: Arrival) -> None:
        """Copy ``tensors`` (any shapes, one device) to the host; ``on_arrival(host_tensors)`` later.

        Device tensors arrive flattened, as float32, in the order given; CPU tensors are passed
        through as they are (a device batch never waits for them, nor they for it). When every
        tensor is on the CPU, ``on_arrival`` runs as soon as the batches before it have landed.
        Tensors on several accelerators are gathered on the first one's.
        """
        if all(t.device.type == "cpu" for t in tensors):
            if not self.queue:
                on_arrival(list(tensors))
                return
            # Batches are still on their way: queue behind them (already landed) to keep the order.
            self.queue.append((HostValue(_NOTHING), lambda _host: on_arrival(list(tensors))))
            self.drain()
            return
        on_device = [i for i, t in enumerate(tensors) if t.device.type != "cpu"]
        device = tensors[on_device[0]].device
        flat = [tensors[i].detach().reshape(-1).to(device, torch.float32) for i in on_device]
        joined = torch.cat(flat) if len(flat) > 1 else flat[0]
        sizes = [f.numel() for f in flat]
        kept = list(tensors)

        def reassemble(host: torch.Tensor) -> None:
            for i, part in zip(on_device, host.split(sizes), strict=True):
                kept[i] = part
            on_arrival(kept)

        self.queue.append((HostValue(joined), reassemble))
        while len(self.queue) > self.MAX_IN_FLIGHT:
            self._hand_over_oldest()
        self.drain()

    def drain(self, wait: bool = False) -> None:
        """Hand over every batch that has landed (every batch, waiting for them, when ``wait``)."""
        queue = self.queue
        while queue and (wait or queue[0][0].ready()):
            self._hand_over_oldest()

    def _hand_over_oldest(self) -> None:
        value, reassemble = self.queue.popleft()
        reassemble(value.wait())
