"""Data-parallel replicas hold the same parameters (``replicas_consistent``).

On each of the first ``dense_steps`` steps, then every ``replica_every`` steps, every rank computes
a checksum per parameter (float64 L1 and L2 norms, one ``_foreach_norm`` each: the L2 norm alone is
blind, to first order, to an update orthogonal to the weights, the L1 norm to one that cancels in
sign; together they see any real divergence) and all-gathers it with the step number and the
parameter count. Divergence: a parameter whose checksums differ by more than ``replica_rtol``
relative. With two ranks both are named; with more, each rank is compared with the per-parameter
median, so the odd ones out are named. Only the lowest rank of the compared group emits the event
(every rank's status says violated).

Until there is something to compare (torch.distributed not initialized yet, or one rank), the
check looks again every ``max_check_every`` steps only, at the same step indices on every rank, so
that a single-process run does not wake the checker every ``replica_every`` steps for nothing.

Collectives: a dedicated gloo group, created collectively at the first comparison (every rank runs
the schedule at the same optimizer step), so CUDA tensors never cross and the user's NCCL streams
are untouched. The gathers are asynchronous: issued at the check step, read at a later step once
``Work.is_completed()``. On CUDA the checksum reaches host memory through a non-blocking copy and
an event (no sync); the gather is issued once the copy landed. Gathers are issued in step order on
every rank, so they pair up even if one rank issues later; the step inside each message guards it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import StatusBoard
from publisher.measure.budget import Schedule
from publisher.measure.check import Check
from publisher.measure.fetch import HostValue
from publisher.measure.tensors import ParamNamer, stack_on

REPLICAS = "replicas_consistent"
_DISTRIBUTED = dist.is_available()
_CLOSE_TIMEOUT = timedelta(seconds=10)
_log = logging.getLogger(__name__)


def checksums(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """(P, 2) float64 tensor: L1 and L2 norm of each parameter, on the parameters' device."""
    detached = [p.detach() for p in params]
    l1 = torch._foreach_norm(detached, 1, dtype=torch.float64)
    l2 = torch._foreach_norm(detached, 2, dtype=torch.float64)
    device = l1[0].device
    return torch.stack([stack_on(l1, device), stack_on(l2, device)], dim=1)


class ReplicaCheck(Check):
    names = (REPLICAS,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, process_group,
                 named_params: Callable[[], list[tuple[str, torch.Tensor]]], namer: ParamNamer) -> None:
        self._board = board
        self._namer = namer
        self.schedule = Schedule(config.dense_steps, config.replica_every)
        self._every = config.replica_every
        self._idle_every = max(config.max_check_every, config.replica_every)
        self._rtol = config.replica_rtol
        self._process_group = process_group
        self._named_params = named_params
        self._group = None
        self._names: list[str] = []
        self._params: list[torch.Tensor] = []
        self._width = 0
        self._compared: list[int] = []
        self._outbox: deque[tuple[int, HostValue]] = deque()
        self._inflight: deque[tuple[int, dist.Work, list[torch.Tensor]]] = deque()
        self._stopped = False

    def why_unchecked(self) -> str | None:
        """Why replicas cannot be compared now, or None when they can (same answer on every rank)."""
        if not _DISTRIBUTED:
            return "torch.distributed is not available in this torch build: nothing to compare"
        if not dist.is_initialized():
            return "single process (torch.distributed is not initialized): no replicas to compare"
        group = self._process_group if self._process_group is not None else dist.group.WORLD
        if dist.get_world_size(group) < 2:
            return "only one data-parallel rank: no replicas to compare"
        return None

    @property
    def busy(self) -> bool:
        """Comparisons on their way (they are polled every step until done)."""
        return bool(self._outbox or self._inflight)

    def after_step(self, index: int, step: int) -> None:
        """Called on sampled steps of the first optimizer and while :attr:`busy`."""
        self._poll()
        if self._stopped or not self.schedule.due(index):
            return
        reason = self.why_unchecked()
        # Every rank computes the same index arithmetic, so they switch cadence at the same step.
        self.schedule.retime(self._every if reason is None else self._idle_every, index)
        if reason is not None:
            self._board.idle_message(REPLICAS, reason)
            return
        if self._group is None and not self._setup():
            return
        self._outbox.append((step, HostValue(checksums(self._params).flatten())))
        self._poll()

    def close(self) -> None:
        """Issue and finish the outstanding comparisons (bounded wait), so the last one is reported."""
        try:
            while self._outbox:
                self._issue(*self._outbox.popleft(), wait=True)
            while self._inflight:
                step, work, received = self._inflight.popleft()
                work.wait(_CLOSE_TIMEOUT)
                self._compare(step, received)
        except RuntimeError as exc:  # a peer that already left: nothing more to compare
            _log.info("replica check: last comparison abandoned at close: %s", exc)
        self._outbox.clear()
        self._inflight.clear()

    def _setup(self) -> bool:
        named = self._named_params()
        sharded = [name for name, p in named if type(p).__name__ in ("DTensor", "FlatParameter")]
        if sharded:
            self._stopped = True
            self._board.idle_message(REPLICAS, "parameters are sharded (FSDP/DTensor): ranks hold different "
                                               "shards, not replicas")
            return False
        self._names = [name for name, _ in named]
        self._params = [p for _, p in named]
        self._group = dist.new_group(backend="gloo")
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(sizes, torch.tensor([len(self._params)], dtype=torch.int64), group=self._group)
        self._width = 2 + 2 * int(max(int(s) for s in sizes))
        group = self._process_group
        self._compared = (dist.get_process_group_ranks(group) if group is not None
                          else list(range(dist.get_world_size())))
        return True

    def _poll(self) -> None:
        while self._outbox and self._outbox[0][1].ready():
            self._issue(*self._outbox.popleft())
        while self._inflight and self._inflight[0][1].is_completed():
            step, _, received = self._inflight.popleft()
            self._compare(step, received)

    def _issue(self, step: int, values: HostValue, wait: bool = False) -> None:
        flat = values.wait().to(torch.float64)
        message = torch.full((self._width,), math.nan, dtype=torch.float64)
        message[0] = step
        message[1] = len(self._params)
        message[2 : 2 + flat.numel()] = flat
        received = [torch.empty_like(message) for _ in range(dist.get_world_size())]
        work = dist.all_gather(received, message, group=self._group, async_op=True)
        self._inflight.append((step, work, received))

    def _compare(self, step: int, received: list[torch.Tensor]) -> None:
        rows = torch.stack([received[r] for r in self._compared])
        if not bool((rows[:, 0] == step).all()):
            self._board.report(REPLICAS, "replicas", "unchecked", step,
                               f"ranks compared checksums of different steps ({rows[:, 0].tolist()}): "
                               "skipped")
            return
        count = int(rows[0, 1])
        if not bool((rows[:, 1] == count).all()):
            self._stopped = True
            self._board.report(REPLICAS, "replicas", "unchecked", step,
                               f"ranks hold different numbers of parameters ({rows[:, 1].long().tolist()}): "
                               "not plain data-parallel replicas")
            return
        values = rows[:, 2 : 2 + 2 * count].reshape(len(self._compared), count, 2)
        pair = len(self._compared) == 2
        reference = values[0] if pair else values.median(dim=0).values
        scale = torch.maximum(values.abs(), reference.abs())
        off = (values - reference).abs()
        same = (off <= self._rtol * scale) | (values.isnan() & reference.isnan())
        bad = ~same.all(dim=2)  # (ranks, params)
        if not bool(bad.any()):
            self._board.report(REPLICAS, "replicas", "ok", step,
                               f"{count} parameters identical across {len(self._compared)} ranks "
                               f"(rtol {self._rtol:g}) at step {step}")
            return
        params = bad.any(dim=0).nonzero().flatten().tolist()
        ranks = (list(self._compared) if pair
                 else [self._compared[r] for r in bad.any(dim=1).nonzero().flatten().tolist()])
        # Named now rather than at setup: a model discovered after the first comparison names them.
        names = [self._namer.name(self._params[i], self._names[i]) for i in params]
        relative = (off / scale.clamp_min(torch.finfo(torch.float64).tiny)).nan_to_num(math.inf)
        who = (f"ranks {ranks[0]} and {ranks[1]} disagree" if pair
               else f"rank(s) {ranks} differ from the others")
        message = (f"data-parallel replicas diverged at step {step}: {who} on {len(names)} parameters: "
                   f"{name_list(names)}")
        details = {"ranks": ranks, "params": names[:50], "diverged": len(names), "of": count,
                   "max_relative_difference": float(relative.max()),
                   "likely_causes": [
                       "forward through the raw module instead of the DDP wrapper (no gradient all-reduce)",
                       "model re-cast (.double(), .half(), .to()) after DDP wrapped it",
                       "gradient clipping or other gradient edits on some ranks only",
                       "a faulty all-reduce (network, GPU peer-to-peer link)"]}
        if dist.get_rank() == min(self._compared):
            keys = [(r, n) for r in ranks for n in names]
            self._board.violation(REPLICAS, "replicas", step, message, details, keys)
        else:
            self._board.report(REPLICAS, "replicas", "violated", step, message, details)
