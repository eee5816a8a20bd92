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

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

#: Labels counted for the label prior (on the CPU, for up to this many classes), then no more.
LABELS_COUNTED = 100_000
MAX_COUNTED_CLASSES = 1024

_watches: weakref.WeakSet[CallWatch] = weakref.WeakSet()
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
        self._labels_seen = 0

    def take_clips_without_gradients(self) -> int:
        """How many clip calls saw no gradient since the last call of this (the Monitor's step)."""
        count, self.clips_without_gradients = self.clips_without_gradients, 0
        return count

    def saw_classes(self, classes: int, target: torch.Tensor | None) -> None:
        if classes != self._classes:
            self._classes, self._label_counts, self._labels_seen = classes, None, 0
        entropy = None
        if target is not None and classes <= MAX_COUNTED_CLASSES and self._labels_seen < LABELS_COUNTED:
            labels = target.reshape(-1)
            labels = labels[(labels >= 0) & (labels < classes)]  # ignore_index (-100) and the like
            counts = torch.bincount(labels, minlength=classes)
            self._label_counts = counts if self._label_counts is None else self._label_counts + counts
            self._labels_seen += int(labels.numel())
        if self._label_counts is not None and self._labels_seen:
            shares = self._label_counts[self._label_counts > 0].double() / self._labels_seen
            entropy = float(-(shares * shares.log()).sum())
        self._on_classes(classes, entropy)


def watch(on_classes: Callable[[int, float | None], None]) -> CallWatch:
    """Install the wrappers (once per process) and register a new watch; it lives as long as its
    owner keeps a reference to it."""
    install()
    call_watch = CallWatch(on_classes)
    _watches.add(call_watch)
    return call_watch


def unwatch(call_watch: CallWatch) -> None:
    _watches.discard(call_watch)


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


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def _clip_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def clip(parameters: torch.Tensor | Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        if not _watches or _compiling():
            return original(parameters, *args, **kwargs)
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        result = original(params, *args, **kwargs)
        with contextlib.suppress(Exception):  # noting must never break the user's clipping
            _saw_clip(params, result)
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
    for call_watch in list(_watches):
        call_watch.clips_without_gradients += 1


def _cross_entropy_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def cross_entropy(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original(input, target, *args, **kwargs)
        if _watches and not _compiling():
            with contextlib.suppress(Exception):  # noting must never break the user's loss
                _saw_classification(input, target)
        return result

    cross_entropy._tuimon_wrapped = True  # type: ignore[attr-defined]
    return cross_entropy


def _saw_classification(input: torch.Tensor, target: torch.Tensor) -> None:
    """C from the logits' shape ((N, C, ...) or (C,)); class-index targets on the CPU are counted
    for the label prior (probability targets and device tensors are not read). Only a loss that
    is being trained counts (logits that require grad): not an evaluation or a metric."""
    if not isinstance(input, torch.Tensor) or input.dim() == 0 or not input.requires_grad:
        return
    classes = int(input.shape[1] if input.dim() >= 2 else input.shape[0])
    if classes < 2:
        return
    labels = (
        target
        if isinstance(target, torch.Tensor) and target.device.type == "cpu" and not target.is_floating_point()
        else None
    )
    for call_watch in list(_watches):
        call_watch.saw_classes(classes, labels)
