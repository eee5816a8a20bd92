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
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from publisher.event_kinds import EVENT_KINDS
from publisher.invariants.config import INVARIANT_NAMES, KIND_OF

EmitEvent = Callable[..., None]
EmitStatus = Callable[..., None]

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

    def __init__(self, emit_status: EmitStatus, emit_event: EmitEvent) -> None:
        self._emit_status = emit_status
        self._emit_event = emit_event
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
                  keys: Iterable[Hashable]) -> None:
        """Mark ``name`` violated and emit its event unless these ``keys`` were already reported.

        ``keys`` identify what is wrong (parameter names, rank pairs): the same violation seen at
        every later check stays one episode; a new parameter joining it emits a new event.
        """
        if name in self._disabled:
            return
        self.report(name, source, "violated", step, message, details)
        reported = self._reported.setdefault((name, source), set())
        keys = set(keys)
        if keys - reported:
            reported |= keys
            kind = KIND_OF[name]
            self._emit(self._emit_event, kind, EVENT_KINDS[kind].default_severity, message, step, details)

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


class Schedule:
    """Which step indices a check runs on: the first ``dense`` ones, regular ones, and requests.

    Regular steps are ``every`` apart. :meth:`retime` changes the period from the next regular
    step on, so the step a check already planned for (its hooks may be armed) stays due.
    """

    def __init__(self, dense: int, every: int) -> None:
        self._dense = dense
        self.every = every
        self._anchor = 0  # a regular step; the others are every ``every`` from it
        self._requested: set[int] = set()

    def due(self, index: int) -> bool:
        return (index < self._dense or self.regular(index)
                or (bool(self._requested) and index in self._requested))

    def regular(self, index: int) -> bool:
        """Is ``index`` one of the periodic steps (not a dense one, not a request)?"""
        return index >= self._anchor and (index - self._anchor) % self.every == 0

    def next_due(self, index: int) -> int:
        """The first step index >= ``index`` that is due."""
        if index < self._dense:
            return index
        return min([self._next_regular(index), *(i for i in self._requested if i >= index)])

    def request(self, index: int) -> None:
        """Also run on step ``index`` (a check confirming a suspicion on the next step)."""
        self._requested = {i for i in self._requested if i >= index - 1}
        self._requested.add(index)

    def retime(self, every: int, index: int) -> None:
        """Make regular steps ``every`` apart from the first regular one >= ``index`` on."""
        if every != self.every:
            self._anchor = self._next_regular(index)
            self.every = every

    def _next_regular(self, index: int) -> int:
        anchor = self._anchor
        return anchor + -(-max(0, index - anchor) // self.every) * self.every


class HostValue:
    """A small device tensor on its way to host memory, read only once it has arrived."""

    __slots__ = ("_event", "_host")

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
        return self._event is None or bool(self._event.query())

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._host


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


class ParamNamer:
    """Human names for parameters: module paths when a model is known, else optimizer positions."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def add_root(self, root: torch.nn.Module, prefix: str = "") -> None:
        for name, param in root.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(param), prefix + name)

    def name(self, param: torch.Tensor, fallback: str) -> str:
        return self._names.get(id(param), fallback)


def name_list(names: Sequence[str], limit: int = 6) -> str:
    """``a, b, c and 4 more``: parameter lists short enough for a one-line message."""
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside DDP/DataParallel and ``torch.compile`` wrappers.

    Hooks go on the inner module so that a forward through either the wrapper or the raw module is
    seen, and parameter names carry no ``module.`` prefix.
    """
    while True:
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module) and isinstance(
            model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
        ):
            model = inner
            continue
        original = getattr(model, "_orig_mod", None)
        if isinstance(original, torch.nn.Module):
            model = original
            continue
        return model


def stack_on(values: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Stack 0-dim results that may live on several devices (a model split across GPUs)."""
    return torch.stack([v if v.device == device else v.to(device) for v in values])


def flat_sample(tensor: torch.Tensor, stride: int) -> torch.Tensor:
    """Every ``stride``-th element of the flattened tensor: a view when the tensor is contiguous."""
    flat = tensor.detach().reshape(-1)
    return flat if stride == 1 else flat[::stride]


def sample_stride(numel: int, limit: int) -> int:
    return max(1, math.ceil(numel / limit))


def is_checkable(param: torch.Tensor) -> bool:
    """Floating (or complex) and non-empty: the tensors whose values the checks compare."""
    return (param.is_floating_point() or param.is_complex()) and param.numel() > 0


@dataclass
class WatchedOptimizer:
    """One optimizer and what the checks keep about it: its step count and flat parameter list."""

    index: int
    optimizer: torch.optim.Optimizer
    count: int = 0
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


class CostMeter:
    """Wall time spent in the checker's hooks (``with meter:``), reported as its own overhead."""

    __slots__ = ("_depth", "_started", "spent_ns")

    def __init__(self) -> None:
        self.spent_ns = 0
        self._started = 0
        self._depth = 0

    def __enter__(self) -> None:
        if self._depth == 0:
            self._started = time.perf_counter_ns()
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.spent_ns += time.perf_counter_ns() - self._started


class Check:
    """Base of every check: the invariant names it serves and a flag set when it broke.

    A check that raises is switched off by the checker (its invariants become ``unchecked`` with
    the error), so a bug in a check never stops a training run. ``meter`` (set by the checker)
    times the hooks a check installs itself.
    """

    names: tuple[str, ...] = ()
    dead: bool = False
    meter: CostMeter = CostMeter()

    def close(self) -> None:
        """Remove whatever hooks the check installed."""
