"""Training invariants checked online, inside the training process (after TrainCheck, OSDI 2025).

A training invariant is a rule every healthy run keeps: ``optimizer.step()`` changes the
parameters it owns, every trained parameter gets a gradient, gradients are cleared between steps,
the trained modules run in training mode, data-parallel replicas hold the same weights, every
trainable parameter is in an optimizer and frozen ones stay frozen, tied parameters stay one tensor.
Each rule lives in its own module; :class:`InvariantChecker` installs the hooks and feeds them.
The checks are sampled (every step at first, then every ``check_every`` steps) and, on CUDA, read
their results back without forcing a host-device synchronisation (see :mod:`publisher.invariants.core`).
"""

from __future__ import annotations

from publisher.invariants.checker import InvariantChecker
from publisher.invariants.config import INVARIANT_NAMES, InvariantConfig

__all__ = ["INVARIANT_NAMES", "InvariantChecker", "InvariantConfig"]
