"""Shared machinery of the invariant checks: statuses and episodes, sampling, deferred reads.

Design rules every check follows, gathered here so that each check module stays about its rule:

* **Statuses change, events are episodes.** :class:`StatusBoard` combines what each source
  (usually one optimizer) says about an invariant, calls ``emit_status`` only when the combined
  status changes, and emits one event per episode and parameter set (a new event only for
  parameters not yet reported since the status was last fine).
* **Sampled.** :class:`Schedule`: every step at first, then every N steps, plus the steps a check
  asks for to confirm a suspicion.
* **No host-device sync on the hot path.** A check's verdict is computed on the device as one small
  tensor and handed to :class:`PendingResults`. On the CPU it is read at once; on CUDA it is copied
  to pinned memory with ``non_blocking=True``, a CUDA event is recorded, and the verdict is read at
  a later hook once ``event.query()`` says the copy landed, which never waits for the GPU. Other
  accelerators fall back to a blocking ``.cpu()`` of that small tensor.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from publisher.invariants.config import INVARIANT_NAMES, KIND_OF
from publisher.measure.check import Check
from publisher.measure.fetch import HostValue
from publisher.measure.tensors import ParamNamer
from publisher.wire.event_kinds import EVENT_KINDS

#: Reports one violation episode: ``(kind, severity, message, step, details)``. The invariant link
#: turns it into a finding for the Monitor's episode tracker, which emits the wire event.
EmitViolation = Callable[[str, str, str, int, dict[str, Any]], None]
#: Reports an invariant's combined status: ``(name, status, step, message, details)``.
EmitStatus = Callable[[str, str, "int | None", str, dict[str, Any]], None]

_STATUS_RANK = {"unchecked": 0, "ok": 1, "violated": 2}
_log = logging.getLogger(__name__)


@dataclass
class _Opinion:
    status: str
    step: int | None
    message: str
    details: dict[str, Any]
    order: int


class StatusBoard:
    """The status of every invariant, combined from several sources, published on change.

    A source (an optimizer, the replica check, ...) reports ``ok``/``violated``/``unchecked``
    about one invariant. The invariant is violated when any source says so, ok when at least one
    source checked something and none is violated, unchecked otherwise: it is never ``ok`` when
    nothing was compared.
    """

    def __init__(self, emit_status: EmitStatus, emit_violation: EmitViolation) -> None:
        self._emit_status = emit_status
        self._emit_violation = emit_violation
        self._opinions: dict[str, dict[Hashable, _Opinion]] = {name: {} for name in INVARIANT_NAMES}
        self._idle: dict[str, str] = {}
        self._published: dict[str, tuple[str, str]] = {}  # name -> (status, message) last emitted
        self._disabled: set[str] = set()
        self._reported: dict[tuple[str, Hashable], set[Hashable]] = {}
        self._order = itertools.count()

    def start(self, name: str, message: str) -> None:
        """Announce an invariant as unchecked (once per name), saying why; a reason given earlier
        through :meth:`idle_message` wins over ``message``."""
        self._idle.setdefault(name, message)
        self._publish(name, force=True)

    def idle_message(self, name: str, message: str) -> None:
        """Change what an unchecked invariant says about itself (e.g. why it cannot be checked)."""
        if self._idle.get(name) == message:
            return
        self._idle[name] = message
        if name in self._published:
            self._publish(name)

    def report(self, name: str, source: Hashable, status: str, step: int | None, message: str,
               details: dict[str, Any] | None = None) -> None:
        """Record what ``source`` now says about ``name``; anything but ``violated`` ends its episode."""
        if name in self._disabled:
            return
        if status != "violated":
            self._reported.pop((name, source), None)
        opinions = self._opinions[name]
        previous = opinions.get(source)
        opinions[source] = _Opinion(status, step, message, details or {}, next(self._order))
        # The same status again (every check of a healthy run) cannot change what was published.
        if previous is None or previous.status != status:
            self._publish(name)

    def violation(self, name: str, source: Hashable, step: int, message: str, details: dict[str, Any],
                  keys: Iterable[Hashable], kind: str | None = None) -> None:
        """Mark ``name`` violated and emit its event unless these ``keys`` were already reported.

        ``keys`` identify what is wrong (parameter names, rank pairs): the same violation seen at
        every later check stays one episode; a new parameter joining it emits a new event.
        ``kind``: the event kind, when this violation is another than the invariant's usual one.
        """
        if name in self._disabled:
            return
        self.report(name, source, "violated", step, message, details)
        reported = self._reported.setdefault((name, source), set())
        keys = set(keys)
        if keys - reported:
            reported |= keys
            kind = kind or KIND_OF[name]
            self._emit(self._emit_violation, kind, EVENT_KINDS[kind].default_severity, message, step, details)

    def disable(self, name: str, message: str) -> None:
        """Stop listening to every source of ``name`` (configuration, or an internal error)."""
        self._opinions[name].clear()
        self._idle[name] = message
        self._publish(name)
        self._disabled.add(name)

    def statuses(self) -> dict[str, dict[str, Any]]:
        """The combined state of every announced invariant, with its latest step and message."""
        return {name: self._combined(name) for name in self._published}

    def _combined(self, name: str) -> dict[str, Any]:
        opinions = self._opinions[name].values()
        steps = [o.step for o in opinions if o.step is not None]
        step = max(steps) if steps else None
        worst = max((_STATUS_RANK[o.status] for o in opinions), default=0)
        if worst == 0:
            return {"status": "unchecked", "step": step, "message": self._idle.get(name, ""), "details": {}}
        lead = max((o for o in opinions if _STATUS_RANK[o.status] == worst), key=lambda o: o.order)
        return {"status": lead.status, "step": step, "message": lead.message, "details": dict(lead.details)}

    def _publish(self, name: str, force: bool = False) -> None:
        """Emit the combined status when it changed (or, unchecked, when its reason changed)."""
        state = self._combined(name)
        previous = self._published.get(name)
        self._published[name] = (state["status"], state["message"])
        changed = previous is None or previous[0] != state["status"]
        reason = state["status"] == "unchecked" and previous is not None and previous[1] != state["message"]
        if force or changed or reason:
            self._emit(self._emit_status, name, state["status"], state["step"], state["message"],
                       state["details"])

    @staticmethod
    def _emit(emit: Callable[..., None], *args: Any) -> None:
        """Hand a message to the Monitor; if that fails, log it: the training step goes on."""
        try:
            emit(*args)
        except Exception:
            _log.warning("invariant checker: emitting %s failed", args[0], exc_info=True)


class PendingResults:
    """Verdicts still on their way from the device, handed to their callbacks in order.

    A callback that raises is reported to ``on_error`` with the check that queued it, which
    switches that check off; the other checks' verdicts keep flowing.
    """

    def __init__(self, on_error: Callable[[Check, BaseException], None]) -> None:
        self._on_error = on_error
        self._queue: deque[tuple[Check, HostValue, Callable[[torch.Tensor], None]]] = deque()

    def __bool__(self) -> bool:
        return bool(self._queue)

    def add(self, owner: Check, tensor: torch.Tensor, callback: Callable[[torch.Tensor], None]) -> None:
        self._queue.append((owner, HostValue(tensor), callback))

    def drain(self, wait: bool = False) -> None:
        """Run the callbacks whose values have arrived (all of them, waiting, when ``wait``)."""
        while self._queue and (wait or self._queue[0][1].ready()):
            owner, value, callback = self._queue.popleft()
            if owner.dead:
                continue
            try:
                callback(value.wait())
            except Exception as exc:
                self._on_error(owner, exc)


@dataclass
class WatchedOptimizer:
    """One optimizer and what the checks keep about it: its flat parameter list."""

    index: int
    optimizer: torch.optim.Optimizer
    params: list[torch.Tensor] = field(default_factory=list)
    group_of: list[int] = field(default_factory=list)
    _layout: tuple[int, ...] = ()

    def refresh(self) -> bool:
        """Re-read the parameter list if ``add_param_group`` (or similar) changed it."""
        groups = self.optimizer.param_groups
        layout = tuple(len(group["params"]) for group in groups)
        if layout == self._layout:
            return False
        self._layout = layout
        self.params = [p for group in groups for p in group["params"]]
        self.group_of = [g for g, group in enumerate(groups) for _ in group["params"]]
        return True

    def lr(self, group: int) -> float | None:
        """The learning rate of a group as a number, or None when unknown or on an accelerator."""
        lr = self.optimizer.param_groups[group].get("lr")
        if isinstance(lr, torch.Tensor):
            return float(lr) if lr.device.type == "cpu" and lr.numel() == 1 else None
        return float(lr) if isinstance(lr, (int, float)) else None

    def label(self, namer: ParamNamer, i: int) -> str:
        param = self.params[i]
        group = self.group_of[i]
        position = i - sum(self._layout[:group])
        shape = "x".join(str(s) for s in param.shape) or "scalar"
        return namer.name(param, f"optimizer {self.index} group {group} #{position} [{shape}]")
