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

#: Calls of the loss whose labels are counted for the label prior (on the CPU, for up to
#: :data:`MAX_COUNTED_CLASSES` classes); then the watch costs a shape read and a comparison a call.
COUNTED_CALLS = 16
MAX_COUNTED_CLASSES = 1024

#: The registered watches, weakly (a Monitor that is never closed does not live on through
#: them); a tuple replaced as a whole, so that a call iterates it without copying or locking.
_watches: tuple[weakref.ref[CallWatch], ...] = ()
_install_lock = threading.Lock()
_installed = False


class CallWatch:
    """What the calls told one Monitor: clip calls that had nothing to clip since the last step, the
    number of classes the loss scores, and the entropy of the labels seen (nats)."""

    def __init__(self, on_classes: Callable[[int, float | None], None]) -> None:
        self._on_classes = on_classes
        self.clips_without_gradients = 0
        self._classes: int | None = None
        self._label_counts: torch.Tensor | None = None
        self._counted = 0  # calls whose labels were counted

    def take_clips_without_gradients(self) -> int:
        """How many clip calls saw no gradient since the last call of this (the Monitor's step)."""
        count, self.clips_without_gradients = self.clips_without_gradients, 0
        return count

    def saw_classes(self, classes: int, target: Any) -> None:
        """The trained loss scored ``classes`` classes against ``target``. Class-index labels on
        the CPU are counted for the label prior over the first :data:`COUNTED_CALLS` calls
        (probability targets and device tensors are not read). Tells the owner on the first
        call and once the labels are counted."""
        if classes == self._classes and self._counted >= COUNTED_CALLS:
            return
        if classes != self._classes:
            self._classes, self._label_counts, self._counted = classes, None, 0
        if (not isinstance(target, torch.Tensor) or target.device.type != "cpu" or target.is_floating_point()
                or classes > MAX_COUNTED_CLASSES):
            self._counted = COUNTED_CALLS  # nothing to count: the prior stays unknown
        else:
            labels = target.reshape(-1)
            labels = labels[(labels >= 0) & (labels < classes)]  # ignore_index (-100) and the like
            counts = torch.bincount(labels, minlength=classes)
            self._label_counts = counts if self._label_counts is None else self._label_counts + counts
            self._counted += 1
        if self._counted == 1 or self._counted >= COUNTED_CALLS:
            self._on_classes(classes, self._entropy())

    def _entropy(self) -> float | None:
        """The entropy of the labels counted so far, in nats (None: none counted)."""
        counts = self._label_counts
        if counts is None or not int(counts.sum()):
            return None
        shares = counts[counts > 0].double() / counts.sum()
        return float(-(shares * shares.log()).sum())


def watch(on_classes: Callable[[int, float | None], None]) -> CallWatch:
    """Install the wrappers (once per process) and register a new watch; it lives as long as its
    owner keeps a reference to it."""
    install()
    global _watches
    call_watch = CallWatch(on_classes)
    with _install_lock:
        _watches = (*_watches, weakref.ref(call_watch))
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
        except Exception:  # noting must never break the user's clipping
            pass
        return result

    clip._tuimon_wrapped = True  # type: ignore[attr-defined]
    return clip


def _saw_clip(params: list[torch.Tensor], result: Any) -> None:
    """A clip over trainable parameters without gradients, or (on the CPU, where reading it is
    free) whose gradients were all zero: it clipped nothing. Frozen parameters never have
    gradients, so a clip over those alone is not counted."""
    params = [p for p in params if isinstance(p, torch.Tensor) and p.requires_grad]
    if not params:
        return
    has_gradients = any(p.grad is not None for p in params)
    if has_gradients:
        if not (isinstance(result, torch.Tensor) and result.device.type == "cpu" and result.numel() == 1):
            return
        if float(result) != 0.0:
            return
    for call_watch in _live_watches():
        call_watch.clips_without_gradients += 1


def _cross_entropy_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def cross_entropy(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original(input, target, *args, **kwargs)
        if _watches and not _compiling():
            try:  # noqa: SIM105 (a plain try costs less than contextlib.suppress on every call)
                _saw_classification(input, target)
            except Exception:  # noting must never break the user's loss
                pass
        return result

    cross_entropy._tuimon_wrapped = True  # type: ignore[attr-defined]
    return cross_entropy


def _saw_classification(input: torch.Tensor, target: torch.Tensor) -> None:
    """C from the logits' shape ((N, C, ...) or (C,)). Only a loss that is being trained counts
    (logits that require grad): not an evaluation or a metric."""
    if not isinstance(input, torch.Tensor) or not input.requires_grad:
        return
    shape = input.shape
    classes = shape[1] if len(shape) >= 2 else shape[0] if shape else 0
    if classes >= 2:
        for call_watch in _live_watches():
            call_watch.saw_classes(classes, target)
