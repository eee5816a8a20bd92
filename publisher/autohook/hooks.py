"""Zero-code instrumentation: monitor an unmodified PyTorch program (what ``tuimon run`` loads).

``tuimon run`` puts ``publisher/autohook/_autostart`` on ``PYTHONPATH``; its ``sitecustomize`` calls
:func:`install` in every Python process of the job (the launcher, ``torchrun`` workers, children
of ``torch.multiprocessing.spawn``). Nothing happens until the program imports torch, and no
Monitor exists until an optimizer steps (it starts as the first ``step()`` begins, so that its
checks see the parameters before any update), so processes that never train (a launcher,
DataLoader workers, a helper script) publish nothing.

What is hooked, all through public PyTorch extension points or thin wrappers:

- ``torch.optim.optimizer.register_optimizer_step_{pre,post}_hook``: every outermost
  ``optimizer.step()``. The first optimizer to step is the *primary* one; each of its steps is
  one training step and calls :meth:`Monitor.step`. Other optimizers (a GAN's second one) join
  the Monitor.
- ``Tensor.backward``: a scalar tensor that is backpropagated is the loss; the losses since the
  previous step are averaged (gradient accumulation, LBFGS closures).
- ``_BaseDataLoaderIter.__next__``: time spent waiting for a batch (``data_time``), its arrival
  (where ``compute_time`` starts), its size (``samples_per_s``) and its fingerprint (repeated
  batches: :mod:`publisher.readings.batches`).
- The Monitor's hang watchdog (:mod:`publisher.threads.watchdog`) follows the thread that steps
  the primary optimizer, as it follows the caller of ``Monitor.step`` in a hand-written loop.
- ``clip_grad_norm_``, ``clip_grad_value_`` and ``cross_entropy`` are watched
  (:mod:`publisher.patches.torch_calls`), installed as torch is imported so that the script's own
  imports of those names see the watched ones.

Configuration comes from the environment ``tuimon run`` sets: ``TUIMON_RUN``,
``TUIMON_RECORD`` (a path prefix: each process appends ``.rank<R>.pid<P>.jsonl``),
``TUIMON_ENDPOINT`` (a ``tcp://host:port`` gets ``port + local rank``), ``TUIMON_GPU``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
from collections import deque
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from publisher.monitor import Monitor
    from publisher.readings.batches import LoaderBook, LoaderPasses

log = logging.getLogger("tuimon.publisher")

ENV_AUTOSTART = "TUIMON_AUTOSTART"
ENV_RUN = "TUIMON_RUN"
ENV_RECORD = "TUIMON_RECORD"
ENV_ENDPOINT = "TUIMON_ENDPOINT"
ENV_GPU = "TUIMON_GPU"
#: "1": the program repeats batches on purpose (an overfit-one-batch check).
ENV_REPEATED_BATCHES = "TUIMON_REPEATED_BATCHES"
#: What a step with non-finite gradients does: ``report``, ``skip`` or ``stop`` (:mod:`publisher.nonfinite`).
ENV_ON_NONFINITE = "TUIMON_ON_NONFINITE"
#: "1": repro bundles hold the weights too.
ENV_REPRO_WEIGHTS = "TUIMON_REPRO_WEIGHTS"
#: The share of step time the gradient norm may cost (``Monitor(grad_norm_budget=)``); unset: the default.
ENV_GRAD_NORM_BUDGET = "TUIMON_GRAD_NORM_BUDGET"

#: The attribute set on torch once it is instrumented: a second install would wrap twice.
_INSTRUMENTED = "_tuimon_instrumented"
#: Losses kept between two training steps (their mean is the step's loss): ample for gradient
#: accumulation, and a bound for programs that never step an optimizer.
MAX_PENDING_LOSSES = 1024


def record_path(prefix: str, rank: int, pid: int) -> str:
    """This process's recording: one file per process, every name starting with ``prefix``."""
    return f"{prefix}.rank{rank}.pid{pid}.jsonl"


class _Session:
    """What one process has seen since its last training step, and its Monitor once it trains."""

    def __init__(self) -> None:
        self.monitor: Monitor | None = None
        self.primary: Any = None  # the optimizer whose steps count as training steps
        self.optimizers: list[Any] = []
        # Bounded: a program that calls backward() but never optimizer.step() (manual updates)
        # must not accumulate losses forever.
        self.losses: deque[torch.Tensor] = deque(maxlen=MAX_PENDING_LOSSES)
        self.data_time = 0.0
        self.samples = 0
        self.batches: deque[tuple[LoaderPasses, Any]] = deque(maxlen=64)  # (its loader, batch) since the step
        self.loaders: LoaderBook | None = None  # made once torch is imported
        self.failed = False
        # step() calls in progress: an optimizer subclass whose step() calls super().step() runs
        # the global hooks once per level, and only the outermost one is a training step.
        self.depth = 0

    def start_monitor(self, optimizer: Any) -> Monitor:
        from publisher.monitor import GRAD_NORM_BUDGET, Monitor
        from publisher.readings.identity import default_rank, endpoint_for

        # By the first optimizer step torch.distributed is initialised, so the rank is known.
        rank = default_rank()
        prefix = os.environ.get(ENV_RECORD)
        budget = os.environ.get(ENV_GRAD_NORM_BUDGET)
        monitor = self.monitor = Monitor(
            None,
            optimizer,
            run=os.environ.get(ENV_RUN) or None,
            rank=rank,
            endpoint=endpoint_for(os.environ.get(ENV_ENDPOINT), int(os.environ.get("LOCAL_RANK") or 0)),
            record=record_path(prefix, rank, os.getpid()) if prefix else None,
            gpu=os.environ.get(ENV_GPU) or "auto",
            repeated_batches=os.environ.get(ENV_REPEATED_BATCHES) == "1",
            on_nonfinite=os.environ.get(ENV_ON_NONFINITE) or "report",
            repro_weights=os.environ.get(ENV_REPRO_WEIGHTS) == "1",
            grad_norm_budget=float(budget) if budget else GRAD_NORM_BUDGET,
        )
        if self.batches:  # the batch of this first step, seen before the Monitor existed
            monitor.hold_batch(self.batches[-1][1])
        self.primary = optimizer
        self.optimizers.append(optimizer)
        return monitor

    def before_optimizer_step(self, optimizer: Any) -> None:
        """The first outermost step starts the Monitor *before* the optimizer moves anything: its
        checks then see the parameters as loaded (two copies of a tied weight still equal)."""
        if self.monitor is None and not self.failed:
            try:
                self.start_monitor(optimizer)
            except Exception as exc:  # never break the user's training because of telemetry
                self.stop(exc)

    def stop(self, exc: Exception) -> None:
        self.failed = True
        log.warning("tuimon: zero-code monitoring stopped (%s: %s)", type(exc).__name__, exc)

    def after_optimizer_step(self, optimizer: Any) -> None:
        if self.failed:
            return
        try:
            monitor = self.monitor
            if monitor is None:
                monitor = self.start_monitor(optimizer)
            elif optimizer not in self.optimizers:
                self.optimizers.append(optimizer)
                monitor.add_optimizer(optimizer)
            if optimizer is not self.primary:
                return
            loss = self._take_loss()
            samples, data_time = self.samples or None, self.data_time or None
            self.samples, self.data_time = 0, 0.0
            while self.batches:
                monitor.note_batch(*self.batches.popleft())
            monitor.step(loss, samples=samples, data_time=data_time)
        except Exception as exc:  # never break the user's training because of telemetry
            self.stop(exc)

    def _take_loss(self) -> Any:
        from publisher.readings.step import step_loss

        loss = step_loss(list(self.losses))
        self.losses.clear()
        return loss


_session = _Session()


def _instrument(torch_module: ModuleType) -> None:
    """Install the hooks on an imported torch; safe to call twice."""
    if getattr(torch_module, _INSTRUMENTED, False):
        return
    setattr(torch_module, _INSTRUMENTED, True)  # by name: a module type declares no such attribute
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        _session.depth += 1
        if _session.depth == 1:
            _session.before_optimizer_step(optimizer)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        _session.depth -= 1
        if _session.depth == 0:
            _session.after_optimizer_step(optimizer)

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    from publisher.patches import torch_calls

    def saw_loss(loss: torch.Tensor) -> None:
        _session.losses.append(loss.detach())
        monitor = _session.monitor
        if monitor is not None and loss.grad_fn is not None:
            monitor.offer_graph(loss)

    torch_calls.on_backward(saw_loss)  # installs the watched calls too

    from publisher.readings.batches import batch_size

    original_next = _BaseDataLoaderIter.__next__

    def next_batch(self: Any) -> Any:
        started = time.perf_counter()
        index = getattr(self, "_num_yielded", None)
        batch = original_next(self)
        waited = time.perf_counter() - started
        _session.data_time += waited
        if _session.monitor is not None and not _session.failed:
            _session.monitor.batch_arrived(waited, batch)
        _session.samples += batch_size(batch)
        _session.batches.append((_passes_of(self, index), batch))
        return batch

    # Replacing the method is the point: every DataLoader iterator, whoever made it, is timed.
    _BaseDataLoaderIter.__next__ = next_batch  # type: ignore[method-assign]


def _passes_of(iterator: Any, index: int | None) -> LoaderPasses:
    """The pass counter of the loader an iterator belongs to; a new pass when it starts over (a
    loader makes a new iterator each epoch, or resets a persistent one)."""
    if _session.loaders is None:
        from publisher.readings.batches import LoaderBook

        _session.loaders = LoaderBook()
    passes = _session.loaders.passes_for(iterator)
    if not index:
        passes.new_pass()
    return passes


class _InstrumentTorchOnImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_instrument` right after ``import torch`` completes, wherever it happens."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExec(spec.loader)
        return spec


class _AfterExec(importlib.abc.Loader):
    """Delegates to torch's own loader, then instruments, then puts the original loader back."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            _instrument(module)
        except Exception as exc:
            log.warning(
                "tuimon: could not instrument torch (%s: %s); running unmonitored", type(exc).__name__, exc
            )


def install() -> None:
    """Instrument torch now if it is imported, else as soon as it is."""
    if "torch" in sys.modules:
        _instrument(sys.modules["torch"])
    elif not any(isinstance(finder, _InstrumentTorchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _InstrumentTorchOnImport())
