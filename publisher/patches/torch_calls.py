"""Watching the torch calls the training makes: gradient clipping and the losses.

Silent bugs show only in *how* the loop calls torch:

- clipping before ``loss.backward()`` (or right after ``zero_grad()``) clips nothing: the
  gradients it sees are None or zero, the step then uses the real, unclipped ones, and the
  explosion it was meant to stop shows up, much later, as a loss spike;
- a classifier stuck at chance (labels shuffled apart from their inputs) has a loss of ``log C``
  for C classes, or the entropy of the label distribution: knowing C from the logits' shape
  tells that apart from a slow start within a few dozen steps instead of a hundred;
- a loss given the wrong kind of input (probabilities where it takes logits, log-probabilities
  where it takes probabilities) trains to a floor and stays there, and labels that cannot teach
  (one class only, or batches each of one class) look like good training: both show in the
  loss call's tensors (:mod:`publisher.patches.loss_look`).

So :func:`install` wraps ``torch.nn.utils.clip_grad_norm_``, ``clip_grad_value_`` (both where
users reach them: ``torch.nn.utils`` and ``torch.nn.utils.clip_grad``) and the losses of
:data:`WATCHED_LOSSES` in ``torch.nn.functional`` (which the ``nn.*Loss`` modules call) once per
process. ``binary_cross_entropy`` is not among them: torch itself raises when its input or target
leaves [0, 1], so log-probabilities or logits given to it are loud already, as are class indices
out of range in ``cross_entropy``/``nll_loss`` (an ``IndexError`` on the CPU, a device-side assert
on CUDA). The wrappers call the original first and return its result unchanged; then, if a
:class:`CallWatch` is registered, they note what they saw. They never read a device tensor (no
synchronisation), do nothing while ``torch.compile`` traces, and a name bound before
:func:`install` ran (``from torch.nn.utils import clip_grad_norm_`` at the top of a script that
creates its Monitor later) is not seen: ``tuimon run`` installs them when torch is imported,
before the script's own imports.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch

from publisher.measure.budget import CostBudget
from publisher.measure.tensors import readable
from publisher.patches.loss_look import LossLook, PendingLook, look

#: The losses looked at: those that take logits, log-probabilities or probabilities.
WATCHED_LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "kl_div")
#: Looks whose labels make the label prior (of up to
#: :data:`~publisher.patches.loss_look.MAX_COUNTED_CLASSES` classes); every call is looked at
#: until then.
COUNTED_CALLS = 48
#: Labels, one per example, that a constant label stream needs before it is told apart from a
#: rare class (:class:`~publisher.detectors.labels.SingleClassLabels`): every call is looked at
#: until they are in, for at most :data:`EAGER_CALLS` calls (tiny batches).
EAGER_LABELS = 1400
EAGER_CALLS = 512
#: Then a loss is looked at once in this many of its calls at most: a look costs the loss call its
#: call site, its input's maker and, on an accelerator, about a dozen small queued operations and a
#: copy (on the CPU those run on the step worker: :mod:`publisher.patches.loss_look`); on this
#: project's busy 2-core machine ~75 us a look on the training thread (~0.36 ms when the CPU's
#: were measured there), so ~5 us a call, and a bug that starts later (the sorted part of a
#: stream) is seen within a few hundred steps.
LOOK_EVERY = 16
#: Share of the time between two calls of a loss that its looks may cost on average (on the
#: training thread and on the step worker together): where a look costs more than that once in
#: :data:`LOOK_EVERY` calls, looks come further apart, as the Monitor's other measurements do
#: (:mod:`publisher.measure.budget`). On a CPU a look of a ~1 ms MLP's loss cost the step worker
#: ~0.27 ms (~17 us a step once in 16), and the step worker's Python is paid by the training
#: thread about twice over, in waits for the GIL (``benchmarks/gil_share.py``).
LOOK_BUDGET = 0.0025
#: Looks a watch keeps until its owner takes them.
_KEPT_LOOKS = 1024
#: Gradients probed, and values probed in each, to tell whether ``clip_grad_value_`` saw only zeros.
PROBED = 16

#: Called with each one-number tensor that is backpropagated (``Tensor.backward``: the loss), on
#: the training thread, before its backward runs: the non-finite check reads the step's losses
#: before the update, ``tuimon run`` makes the step's loss of them. A tuple replaced as a whole.
_backward_listeners: tuple[Callable[[torch.Tensor], None], ...] = ()

#: The registered watches, weakly (a Monitor that is never closed does not live on through
#: them); a tuple replaced as a whole, so that a call iterates it without copying or locking.
_watches: tuple[weakref.ref[CallWatch], ...] = ()
_install_lock = threading.Lock()
_installed = False
#: Calls of each watched loss left before its next look (:data:`LOOK_EVERY`, or more: :data:`LOOK_BUDGET`).
_quiet_calls: dict[str, int] = dict.fromkeys(WATCHED_LOSSES, 0)
#: What a look at each watched loss costs, and so how many calls apart its looks come.
_look_budgets: dict[str, CostBudget] = {
    name: CostBudget(LOOK_BUDGET, every=LOOK_EVERY, what="LOOK_BUDGET") for name in WATCHED_LOSSES}
#: When each watched loss was last looked at (``time.perf_counter``), and the calls since then it
#: was left for: the time between two calls, read at a look without timing every call.
_last_look: dict[str, tuple[float, int]] = {}


class CallWatch:
    """What the calls told one Monitor: clip calls that had nothing to clip since the last step, the
    number of classes the loss scores, the entropy of the labels seen (nats), and the looks at the
    watched losses (:class:`~publisher.patches.loss_look.LossLook`) that have reached the host."""

    def __init__(self, on_classes: Callable[[int, float | None], None]) -> None:
        self._on_classes = on_classes
        self.clips_without_gradients = 0
        self._classes: int | None = None
        self._label_counts: list[int] = []
        self._counted = 0  # looks whose labels were counted for the prior
        self._labels = 0  # class-index labels seen in looks, one per example
        self.looked = 0  # looks taken
        #: Looks not yet taken (a Monitor that stopped stepping drops the oldest, not the memory).
        self.pending: deque[PendingLook] = deque(maxlen=_KEPT_LOOKS)
        #: Whether :attr:`pending` holds any: the Monitor's test at every step, an attribute of this
        #: object rather than the deque's length (in place, each object touched costs:
        #: ``benchmarks/step_floor.py``).
        self.waiting = False

    def take_clips_without_gradients(self) -> int:
        """How many clip calls saw no gradient since the last call of this (the Monitor's step)."""
        count, self.clips_without_gradients = self.clips_without_gradients, 0
        return count

    @property
    def eager(self) -> bool:
        """Whether this watch wants every call looked at: the first :data:`COUNTED_CALLS`, and on
        until :data:`EAGER_LABELS` labels, one per example, are in (at most :data:`EAGER_CALLS`)."""
        return self.looked < COUNTED_CALLS or (self._labels < EAGER_LABELS and self.looked < EAGER_CALLS)

    def saw(self, pending: PendingLook) -> None:
        """A look was taken (training thread): tell the owner when the class count is new."""
        classes = pending.classes
        self.looked += 1
        self.pending.append(pending)
        self.waiting = True
        if classes >= 2 and classes != self._classes:
            self._classes, self._label_counts, self._counted = classes, [], 0
            self._on_classes(classes, None)

    def take_looks(self) -> list[PendingLook]:
        """The looks that have reached the host since the last call (the Monitor's step), in order,
        for :meth:`read` on the step worker's thread."""
        pending, looks = self.pending, []
        self.waiting = False  # before reading, so that a look taken meanwhile on another thread says so
        while pending and pending[0].landed():
            looks.append(pending.popleft())
        if pending:
            self.waiting = True
        return looks

    def read(self, pending: PendingLook) -> LossLook:
        """A look taken by :meth:`take_looks`, read (on the CPU: measured) off the training thread.
        The labels of the first :data:`COUNTED_CALLS` looks of the current class count make the
        label prior, told to the owner once known."""
        # The reading's CPU time, not its wall time: a reading on the step worker waits for the GIL
        # while the training thread runs, which is not the reading's cost.
        started = time.thread_time()
        found = pending.read()
        _look_budgets[found.function].charge(pending.cost_s + time.thread_time() - started)
        if found.labels is not None:
            self._labels += sum(found.labels[:-1]) if found.per_example else 0
            self._count(found)
        return found

    def _count(self, found: LossLook) -> None:
        if found.classes != self._classes or self._counted >= COUNTED_CALLS or found.labels is None:
            return
        counts = self._label_counts or [0] * found.classes
        self._label_counts = [a + b for a, b in zip(counts, found.labels, strict=False)]
        self._counted += 1
        if self._counted == COUNTED_CALLS:
            self._on_classes(found.classes, label_entropy(torch.tensor(self._label_counts)))


def label_entropy(counts: torch.Tensor) -> float | None:
    """The entropy of the label distribution (nats) from its counts, with the Miller-Madow
    correction ((K - 1) / 2N for K classes seen in N labels): the plug-in estimate is biased low,
    by ~0.1 nat for 100 classes seen in 500 labels (Paninski, "Estimation of Entropy and Mutual
    Information", Neural Computation 15, 2003)."""
    total = int(counts.sum())
    if not total:
        return None
    seen = counts[counts > 0].double()
    shares = seen / total
    return float(-(shares * shares.log()).sum()) + (len(seen) - 1) / (2 * total)


def watch(on_classes: Callable[[int, float | None], None]) -> CallWatch:
    """Install the wrappers (once per process) and register a new watch; it lives as long as its
    owner keeps a reference to it."""
    install()
    global _watches
    call_watch = CallWatch(on_classes)
    with _install_lock:
        _watches = (*_watches, weakref.ref(call_watch))
        _quiet_calls.update(dict.fromkeys(WATCHED_LOSSES, 0))  # the new watch sees the next calls
        _last_look.clear()  # and the time between calls is measured afresh after its first looks
    return call_watch


def unwatch(call_watch: CallWatch) -> None:
    global _watches
    with _install_lock:
        _watches = tuple(ref for ref in _watches if ref() not in (None, call_watch))


def _live_watches() -> list[CallWatch]:
    return [call_watch for ref in _watches if (call_watch := ref()) is not None]


def install() -> None:
    """Wrap the clip functions and the watched losses where users reach them; idempotent."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        from torch.nn import functional
        from torch.nn import utils as nn_utils
        from torch.nn.utils import clip_grad

        for module in (nn_utils, clip_grad):
            for name in ("clip_grad_norm_", "clip_grad_value_"):
                original = getattr(module, name, None)
                if original is not None and not getattr(original, "_tuimon_wrapped", False):
                    setattr(module, name, _clip_wrapper(original))
        for name in WATCHED_LOSSES:
            setattr(functional, name, _loss_wrapper(name, getattr(functional, name)))
        torch.Tensor.backward = _backward_wrapper(torch.Tensor.backward)  # type: ignore[method-assign]


def on_backward(listener: Callable[[torch.Tensor], None]) -> None:
    """Call ``listener`` with each one-number tensor backpropagated from now on (installs the wrappers)."""
    global _backward_listeners
    install()
    with _install_lock:
        _backward_listeners = (*_backward_listeners, listener)


def off_backward(listener: Callable[[torch.Tensor], None]) -> None:
    global _backward_listeners
    with _install_lock:
        _backward_listeners = tuple(known for known in _backward_listeners if known != listener)


def _backward_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.backward`` telling the listeners of a loss first (a one-number tensor): the loss is on
    its way anyway, and on the CPU it is already on the host."""

    @functools.wraps(original)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _backward_listeners and self.numel() == 1:
            for listener in _backward_listeners:
                try:  # noqa: SIM105 (a plain try costs less than contextlib.suppress on every step)
                    listener(self)
                except Exception:  # nothing must ever break the user's backward
                    pass
        return original(self, *args, **kwargs)

    return backward


#: True while torch.compile traces (the watches then stay out of the graph).
_compiling: Callable[[], bool] = torch.compiler.is_compiling


def _clip_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def clip(parameters: torch.Tensor | Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        if not _watches or _compiling():
            return original(parameters, *args, **kwargs)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        result = original(params, *args, **kwargs)
        try:  # noqa: SIM105 (a plain try costs less than contextlib.suppress on every step)
            _saw_clip(params, result)
        except Exception:  # nothing must ever break the user's clipping
            pass
        return result

    # The mark install() reads so that a function is never wrapped twice; a function object takes
    # any attribute, but the type functools.wraps returns declares none.
    clip._tuimon_wrapped = True  # type: ignore[attr-defined]
    return clip


def _saw_clip(params: list[torch.Tensor], result: Any) -> None:
    """A clip over trainable parameters without gradients, or whose gradients were all zero (the
    zeros ``zero_grad(set_to_none=False)`` leaves): it clipped nothing. Zero is told by the total
    norm ``clip_grad_norm_`` returns, or, for ``clip_grad_value_`` (which returns nothing), by a
    strided probe of the gradients; either only on the CPU, where reading is free. Frozen
    parameters never have gradients, so a clip over those alone is not counted."""
    params = [p for p in params if isinstance(p, torch.Tensor) and p.requires_grad]
    if not params:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        if isinstance(result, torch.Tensor):
            if result.device.type != "cpu" or result.numel() != 1 or float(result) != 0.0:
                return
        elif not _all_zero(grads):
            return
    for call_watch in _live_watches():
        call_watch.clips_without_gradients += 1


def _all_zero(grads: list[torch.Tensor]) -> bool:
    """Are these gradients all zero, as far as a probe of :data:`PROBED` values of each of the first
    :data:`PROBED` can tell? False as soon as one is not, or is not a dense CPU tensor (unknown)."""
    for grad in grads[:PROBED]:
        if grad.device.type != "cpu" or grad.layout != torch.strided:
            return False
        flat = grad.detach().reshape(-1)
        if flat[:: max(1, flat.numel() // PROBED)][:PROBED].any():
            return False
    return True


def _loss_wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def loss(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original(input, target, *args, **kwargs)
        if _quiet_calls[name]:
            _quiet_calls[name] -= 1
        elif _watches and not _compiling():
            try:  # noqa: SIM105 (a plain try costs less than contextlib.suppress on every call)
                _look(name, input, target, kwargs.get("log_target", False))
            except Exception:  # nothing must ever break the user's loss
                pass
        return result

    return loss


def _look(name: str, input: torch.Tensor, target: Any, log_target: bool) -> None:
    """Look at a call (:mod:`publisher.patches.loss_look`) and hand the look to every watch. Only a
    loss that is being trained counts (an input that requires grad): not an evaluation or a
    metric. The next call is looked at too while a watch is :attr:`~CallWatch.eager`."""
    if not isinstance(input, torch.Tensor) or not input.requires_grad or not readable(input):
        return  # an evaluation, a metric, or a tensor no look can read (sparse, complex, traced)
    started = time.perf_counter()
    pending = look(name, input, target, bool(log_target))
    pending.cost_s = time.perf_counter() - started
    watches = _live_watches()
    for call_watch in watches:
        call_watch.saw(pending)
    if not any(call_watch.eager for call_watch in watches):
        _quiet_calls[name] = _next_gap(name, started) - 1


def _next_gap(name: str, now: float) -> int:
    """Calls of ``name`` from this look to the next: :data:`LOOK_EVERY`, or more where its looks
    cost more than :data:`LOOK_BUDGET` of the time between calls (measured over the calls since
    the previous look, so a pause between them makes looks more frequent, never rarer)."""
    previous = _last_look.get(name)
    call_s = (now - previous[0]) / previous[1] if previous is not None else None
    gap = _look_budgets[name].gap(call_s)
    _last_look[name] = (now, gap)
    return gap
