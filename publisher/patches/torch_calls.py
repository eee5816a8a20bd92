"""Watching two kinds of torch calls the training makes: gradient clipping and the classification loss.

Two silent bugs show only in *how* the loop calls torch:

- clipping before ``loss.backward()`` (or right after ``zero_grad()``) clips nothing: the
  gradients it sees are None or zero, the step then uses the real, unclipped ones, and the
  explosion it was meant to stop shows up, much later, as a loss spike;
- a classifier stuck at chance (labels shuffled apart from their inputs) has a loss of ``log C``
  for C classes, or the entropy of the label distribution: knowing C from the logits' shape
  tells that apart from a slow start within a few dozen steps instead of a hundred.

So :func:`install` wraps ``torch.nn.utils.clip_grad_norm_``, ``clip_grad_value_`` (both where
users reach them: ``torch.nn.utils`` and ``torch.nn.utils.clip_grad``) and
``torch.nn.functional.cross_entropy`` (which ``nn.CrossEntropyLoss`` calls) once per process.
The wrappers call the original first and return its result unchanged; then, if a :class:`CallWatch`
is registered, they note what they saw. They never read a device tensor (no synchronisation), do
nothing while ``torch.compile`` traces, and a name bound before :func:`install` ran (``from
torch.nn.utils import clip_grad_norm_`` at the top of a script that creates its Monitor later) is
not seen: ``tuimon run`` installs them when torch is imported, before the script's own imports.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

#: Calls of the loss whose labels are counted for the label prior (up to
#: :data:`MAX_COUNTED_CLASSES` classes); then the watch costs a shape read and a comparison a call.
COUNTED_CALLS = 48
MAX_COUNTED_CLASSES = 4096
#: Once every watch knows the classes and the prior, the loss is looked at once in this many calls
#: (a change of the class count is rare: a second task), so that the watch costs a counter a call.
LOOK_EVERY = 64
#: Gradients probed, and values probed in each, to tell whether ``clip_grad_value_`` saw only zeros.
PROBED = 16

#: The registered watches, weakly (a Monitor that is never closed does not live on through
#: them); a tuple replaced as a whole, so that a call iterates it without copying or locking.
_watches: tuple[weakref.ref[CallWatch], ...] = ()
_install_lock = threading.Lock()
_installed = False
_quiet_calls = 0  # calls of the loss left before the next look (:data:`LOOK_EVERY`)


class CallWatch:
    """What the calls told one Monitor: clip calls that had nothing to clip since the last step, the
    number of classes the loss scores, and the entropy of the labels seen (nats)."""

    def __init__(self, on_classes: Callable[[int, float | None], None]) -> None:
        self._on_classes = on_classes
        self.clips_without_gradients = 0
        self._classes: int | None = None
        self._label_counts: torch.Tensor | None = None
        self._counted = 0  # calls whose labels were counted
        self._reading: tuple[torch.Tensor, Any] | None = None  # counts on their way to the host

    def take_clips_without_gradients(self) -> int:
        """How many clip calls saw no gradient since the last call of this (the Monitor's step)."""
        count, self.clips_without_gradients = self.clips_without_gradients, 0
        return count

    def saw_classes(self, classes: int, target: Any) -> bool:
        """The trained loss scored ``classes`` classes against ``target``.

        Class-index labels are counted for the label prior over the first :data:`COUNTED_CALLS`
        calls, on their own device (``bincount`` is queued there like any kernel); the counts
        then come back to the host without waiting for the device (a non-blocking copy whose
        CUDA event is polled on later calls). Probability targets are not counted. Tells the
        owner on the first call and once the prior is known. True once there is nothing left to
        count or read (only a change of the class count is news).
        """
        if classes == self._classes and self._counted >= COUNTED_CALLS and self._reading is None:
            return True
        if classes != self._classes:
            self._classes, self._label_counts, self._counted, self._reading = classes, None, 0, None
        if self._counted < COUNTED_CALLS:
            self._count(classes, target)
            if self._counted == 1:
                self._on_classes(classes, None)
        if self._reading is not None and (self._reading[1] is None or self._reading[1].query()):
            counts, self._reading = self._reading[0], None
            self._on_classes(classes, label_entropy(counts))
        return False

    def _count(self, classes: int, target: Any) -> None:
        if (not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex()
                or classes > MAX_COUNTED_CLASSES):
            self._counted = COUNTED_CALLS  # nothing to count: the prior stays unknown
            return
        labels = target.detach().reshape(-1).long()
        # Labels outside [0, C) (ignore_index, -100) go to an extra bucket. Not bincount, nor a
        # boolean mask: both need the result's size on the host, a device synchronisation.
        labels = labels.masked_fill((labels < 0) | (labels >= classes), classes)
        if self._label_counts is None:
            self._label_counts = torch.zeros(classes + 1, dtype=torch.long, device=labels.device)
        self._label_counts.index_add_(0, labels, torch.ones_like(labels))
        self._counted += 1
        if self._counted == COUNTED_CALLS:
            self._reading = _to_host(self._label_counts[:classes])


def _to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Start copying ``tensor`` to the host: (the host tensor, a CUDA event that says when it has
    landed, or None when it is there already)."""
    if tensor.device.type != "cuda":
        return tensor.cpu(), None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


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
    global _watches, _quiet_calls
    call_watch = CallWatch(on_classes)
    with _install_lock:
        _watches = (*_watches, weakref.ref(call_watch))
        _quiet_calls = 0  # the new watch sees the next call
    return call_watch


def unwatch(call_watch: CallWatch) -> None:
    global _watches
    with _install_lock:
        _watches = tuple(ref for ref in _watches if ref() not in (None, call_watch))


def _live_watches() -> list[CallWatch]:
    return [call_watch for ref in _watches if (call_watch := ref()) is not None]


def install() -> None:
    """Wrap the clip functions and ``cross_entropy`` where users reach them; idempotent."""
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
        functional.cross_entropy = _cross_entropy_wrapper(functional.cross_entropy)


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


def _cross_entropy_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def cross_entropy(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        global _quiet_calls
        result = original(input, target, *args, **kwargs)
        if _quiet_calls:
            _quiet_calls -= 1
        elif _watches and not _compiling():
            try:  # noqa: SIM105 (a plain try costs less than contextlib.suppress on every call)
                _saw_classification(input, target)
            except Exception:  # nothing must ever break the user's loss
                pass
        return result

    return cross_entropy


def _saw_classification(input: torch.Tensor, target: torch.Tensor) -> None:
    """C from the logits' shape ((N, C, ...) or (C,)). Only a loss that is being trained counts
    (logits that require grad): not an evaluation or a metric."""
    if not isinstance(input, torch.Tensor) or not input.requires_grad:
        return
    shape = input.shape
    classes = shape[1] if len(shape) >= 2 else shape[0] if shape else 0
    if classes >= 2:
        settled = [call_watch.saw_classes(classes, target) for call_watch in _live_watches()]
        if all(settled):
            global _quiet_calls
            _quiet_calls = LOOK_EVERY - 1
