"""Connects the invariant checker (``publisher.invariants``) to a Monitor's stream and event episodes.

The checker counts optimizer steps itself, from 0, from the moment it is built; the Monitor numbers
steps as the training loop reports them (from 1, or the user's ``step=``), and a zero-code Monitor
is built inside the first optimizer step. :meth:`InvariantLink.sync` is called at each
``Monitor.step`` to keep the two numberings aligned, so that invariant events and statuses carry
the same step numbers as the metrics and the detectors' events.

Statuses become ``invariant`` messages. Violations become events through the same
:class:`~publisher.detectors.episodes.EpisodeTracker` as the detectors' findings: one event per episode
(per invariant), re-sent with a growing ``count`` when the checker reports it again, ended when the
invariant's status returns to ``ok``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from publisher.detectors.base import Finding
from publisher.detectors.episodes import EpisodeTracker
from publisher.invariants import InvariantChecker, InvariantConfig
from publisher.invariants.config import KIND_OF
from publisher.measure.budget import StepClock
from publisher.wire.jsonsafe import json_safe

Publish = Callable[..., None]


class _Owner:
    """The episode owner of one invariant's events (the tracker keys episodes by owner)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class InvariantLink:
    """Builds the :class:`InvariantChecker` and forwards what it says to the Monitor's stream."""

    #: An invariant episode stays open until its status is ``ok`` again; never aged by silence.
    _NEVER = 1 << 62

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        model: nn.Module | None,
        *,
        publish: Publish,
        tracker: EpisodeTracker,
        rank: int,
        config: InvariantConfig | None,
        steps_done: int,
        step_clock: StepClock,
    ) -> None:
        self._publish = publish
        self._tracker = tracker
        self._owners = {name: _Owner(name) for name in KIND_OF}
        self._by_kind = {kind: self._owners[name] for name, kind in KIND_OF.items()}
        # Checker index i is Monitor step i + offset; the next optimizer step is the Monitor's next.
        self._offset = steps_done + 1
        self.checker = InvariantChecker(
            optimizers, model, emit_violation=self._on_violation, emit_status=self._on_status, config=config,
            rank=rank, step_clock=step_clock,
        )
        self._counted = self.checker.counted_by()

    def sync(self, step: int) -> None:
        """After ``Monitor.step(step)``: that step is the checker's latest one (if it saw it).
        Called on every step: with one optimizer its count is read where it is kept."""
        counted = self._counted
        done = counted[0].count - counted[1] if counted is not None else self.checker.steps_done
        self._offset = step - done + 1

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.checker.add_optimizer(optimizer)
        self._counted = self.checker.counted_by()

    def close(self) -> None:
        self.checker.close()

    def _step(self, index: int | None) -> int | None:
        return None if index is None else index + self._offset

    def _on_status(self, name: str, status: str, step: int | None, message: str,
                   details: dict[str, Any]) -> None:
        self._publish("invariant", self._step(step), name=name, status=status, message=message,
                      details=json_safe(details or {}))
        if status == "ok" and name in self._owners:
            # The invariant holds again: its episode, if any, ends here.
            self._tracker.observe(self._owners[name], self._step(step), (), quiet_to_close=1)

    def _on_violation(self, kind: str, severity: str, message: str, step: int,
                      details: dict[str, Any]) -> None:
        owner = self._by_kind.get(kind) or self._owners.setdefault(kind, _Owner(kind))
        finding = Finding(kind, message, dict(details or {}), severity=severity)
        self._tracker.observe(owner, self._step(step), [finding], quiet_to_close=self._NEVER)
