"""What the framework callbacks share: one Monitor per rank, its life, and each step's loss.

A framework owns the loop, so a callback cannot call ``Monitor.step(loss)`` the way a hand-written
loop does; it is told about micro-batches and optimizer steps at the framework's own hook points.
:class:`CallbackSession` turns those into a Monitor's life:

- :meth:`~CallbackSession.start` when the framework has the model and its optimizers (the Monitor's
  invariants hook the optimizers, and its first checks must see the weights before any update);
  per rank: the rank and world size come from the framework, a ``record`` path gets the rank in
  its name when there are several, a fixed ``tcp://`` port is shifted by the local rank (as for
  ``tuimon run``), and every rank agrees on rank 0's run name;
- :meth:`~CallbackSession.note_loss` for each training micro-batch, :meth:`~CallbackSession.step`
  after each optimizer step, while the gradients the step used are still there: the step's loss
  is combined from its micro-batches on their device (no host-device synchronisation; the
  Monitor reads device numbers with one asynchronous copy);
- :meth:`~CallbackSession.close` at the end of training, with the exception that ended it, if any.

Under ``tuimon run`` (``$TUIMON_AUTOSTART=1``) the process is already watched through PyTorch's own
hooks (:mod:`publisher.autohook`): a callback then stands aside rather than publish every step twice.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from publisher.monitor import Monitor
from publisher.readings.identity import default_run_name, endpoint_for, local_rank
from publisher.readings.step import step_loss
from publisher.wire.run_end import end_status

log = logging.getLogger(__name__)

#: Set by ``tuimon run`` in every process it starts (:mod:`publisher.autohook`).
AUTOSTART_ENV = "TUIMON_AUTOSTART"
#: Micro-batch losses kept until the next optimizer step: ample for gradient accumulation, and a
#: bound for a loop whose optimizer never steps.
MAX_PENDING_LOSSES = 1024
#: What the framework decides, not the callback's caller.
_FRAMEWORK_ARGUMENTS = ("model", "optimizer")


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse a keyword the Monitor does not take when the callback is made (a typo would otherwise
    surface only once training starts); ``TypeError`` names it."""
    taken = [name for name in _FRAMEWORK_ARGUMENTS if name in options]
    if taken:
        raise TypeError(f"TuimonCallback gets {', '.join(taken)} from the framework; do not pass it")
    try:
        inspect.signature(Monitor).bind_partial(**options)
    except TypeError as exc:
        raise TypeError(f"TuimonCallback takes the Monitor's keyword arguments: {exc}") from None


def record_for(
    record: str | os.PathLike[str] | None, rank: int, world_size: int
) -> str | os.PathLike[str] | None:
    """One recording per rank: ``runs/exp.jsonl`` is ``runs/exp.rank1.jsonl`` for rank 1 of several."""
    if record is None or world_size <= 1:
        return record
    path = Path(record)
    return str(path.with_name(f"{path.stem}.rank{rank}{path.suffix}"))


def agreed_run_name(device: torch.device | None = None) -> str:
    """The default run name (``$TUIMON_RUN``, else rank 0's start time), the same on every rank.

    The default names runs by the second they start; ranks start within moments of each other,
    but not always within one second, and a run split in two in the viewer is worse than a
    broadcast of one number at start-up (a tensor, not a pickled object, over the framework's own
    process group). ``device``: where the process group's backend wants tensors (CUDA for NCCL).
    """
    if os.environ.get("TUIMON_RUN"):
        return default_run_name()
    dist = torch.distributed
    started = time.time()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        stamp = torch.tensor([int(started)], dtype=torch.int64,
                             device=device if dist.get_backend() == "nccl" else "cpu")
        dist.broadcast(stamp, src=0)
        started = float(stamp.item())
    return time.strftime("run-%Y%m%d-%H%M%S", time.localtime(started))


class CallbackSession:
    """One rank's Monitor as a framework callback drives it; ``options`` are the Monitor's keywords."""

    def __init__(self, framework: str, options: Mapping[str, Any]) -> None:
        check_options(options)
        self.framework = framework
        self.options = dict(options)
        self.monitor: Monitor | None = None
        self._handles: list[Any] = []
        self._losses: deque[torch.Tensor] = deque(maxlen=MAX_PENDING_LOSSES)
        self._shares = False
        self._samples = 0
        self._tokens = 0

    def start(
        self,
        model: torch.nn.Module,
        optimizers: Iterable[torch.optim.Optimizer],
        *,
        rank: int,
        world_size: int,
        run: str | None = None,
        config: Mapping[str, Any] | None = None,
        device: torch.device | None = None,
    ) -> bool:
        """Build this rank's Monitor (the first optimizer is the primary one); False when standing
        aside under ``tuimon run``. A Monitor left open by a training that never reached its end
        hook (an exception the framework does not report) is closed as failed first. Raises what
        the Monitor raises for arguments a user must fix (an address in use, a bad setting)."""
        if self.monitor is not None:
            self._end("failed", "the previous training ended without reaching its end")
        if os.environ.get(AUTOSTART_ENV) == "1":
            log.info("tuimon: `tuimon run` watches this process already; the %s callback stands aside",
                     self.framework)
            return False
        options = dict(self.options)
        listed = list(optimizers)
        optimizer, others = (listed[0], listed[1:]) if listed else (None, [])
        for name, value in (("rank", rank), ("world_size", world_size)):
            if options.get(name) is None:
                options[name] = value
        options["run"] = options.get("run") or run or agreed_run_name(device)
        options["record"] = record_for(options.get("record"), options["rank"], options["world_size"])
        options["endpoint"] = endpoint_for(options.get("endpoint"), local_rank())
        if options.get("config") is None and config is not None:
            options["config"] = config
        self.monitor = Monitor(model, optimizer, **options)
        for other in others:
            self.monitor.add_optimizer(other)
        return True

    def own(self, handle: Any) -> None:
        """A hook handle (``.remove()``) the callback installed: removed when the session closes."""
        self._handles.append(handle)

    def note_loss(
        self, loss: torch.Tensor | None, *, shares: bool, samples: int = 0, tokens: int = 0
    ) -> None:
        """A training micro-batch: its loss (detached, any device), and whether that loss is already
        its share of the step's (the framework divided it for gradient accumulation: the step's
        loss is then their sum, else their mean); its samples and tokens, for throughput."""
        if self.monitor is None:
            return
        if loss is not None:
            self._losses.append(loss)
            self._shares = shares
        self._samples += samples
        self._tokens += tokens

    def step(self, step: int) -> None:
        """The framework's optimizer step ``step`` is done, its gradients not yet cleared."""
        monitor = self.monitor
        if monitor is None:
            return
        losses = list(self._losses)
        self._losses.clear()
        samples, tokens, self._samples, self._tokens = self._samples, self._tokens, 0, 0
        try:
            loss = step_loss(losses, shares=self._shares)
        except RuntimeError as exc:  # losses on different devices, odd shapes: the step goes on
            log.warning("tuimon: no loss for step %d (%s)", step, exc)
            loss = None
        monitor.step(loss, step=step, samples=samples or None, tokens=tokens or None)

    def close(self, exc: BaseException | None = None) -> None:
        """Training ended, by ``exc`` if given: ``run_end`` says completed, interrupted or failed."""
        if self.monitor is not None:
            self._end(*end_status(exc))

    def _end(self, status: str, error: str | None) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._losses.clear()
        self._samples = self._tokens = 0
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            monitor.close(status, error)
