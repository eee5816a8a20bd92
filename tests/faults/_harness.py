"""Shared pieces of the fault and healthy training scripts in this folder.

Every script defines ``CASE = Case(...)`` with a ``train(run)`` function (a small real CPU training
loop, bug included) and ends with ``raise SystemExit(main(CASE))`` so that it runs standalone::

    python tests/faults/fault_missing_zero_grad.py

The tests import the scripts and call :func:`run_case` / :func:`judge`. Scripts build their loop
from the helpers here (models, data, one training step), so no two scripts share copied code.

What a script's training is watched by: :meth:`Run.watch`, the one place that builds the watcher.
It now constructs the :class:`InvariantChecker` with a :class:`Recording`'s emit functions; the
recording holds wire-shaped ``event`` / ``invariant`` dicts (as in ``docs/protocol.md``). To
switch to the real Monitor later, ``Run.watch`` builds ``Monitor(..., record=<path>)`` instead and
:func:`run_case` reads that JSON Lines file back with :meth:`Recording.from_jsonl`; the scripts and
the assertions (which only read recordings) stay as they are.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from publisher.invariants import InvariantChecker, InvariantConfig

FAULTS_DIR = Path(__file__).resolve().parent
ALARM_SEVERITIES = ("warning", "critical")


# --------------------------------------------------------------------------- recording


@dataclass
class Recording:
    """What the watcher emitted on one rank, as wire-shaped dicts (``type`` event / invariant)."""

    rank: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    def emit_event(self, kind: str, severity: str, message: str, step: int, details: dict) -> None:
        self.messages.append({"type": "event", "rank": self.rank, "step": step, "kind": kind,
                              "severity": severity, "message": message, "details": details})

    def emit_status(self, name: str, status: str, step: int | None, message: str, details: dict) -> None:
        self.messages.append({"type": "invariant", "rank": self.rank, "step": step, "name": name,
                              "status": status, "message": message, "details": details})

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "event" and kind in (None, m["kind"])]

    def alarms(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["severity"] in ALARM_SEVERITIES]

    def statuses(self, name: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "invariant" and m["name"] == name]

    def to_jsonl(self, path: Path) -> None:
        path.write_text("".join(json.dumps(m, default=str) + "\n" for m in self.messages))

    @classmethod
    def from_jsonl(cls, path: Path, rank: int = 0) -> Recording:
        return cls(rank, [json.loads(line) for line in path.read_text().splitlines() if line.strip()])


# --------------------------------------------------------------------------- cases


@dataclass
class Run:
    """One rank's run of a case: which rank, and the watchers its training loop attached."""

    rank: int = 0
    world_size: int = 1
    model_known: bool = True
    config: InvariantConfig | None = None
    recording: Recording = field(default_factory=Recording)
    checkers: list[InvariantChecker] = field(default_factory=list)

    def watch(self, optimizers: Sequence[torch.optim.Optimizer], model: nn.Module | None = None
              ) -> InvariantChecker:
        """Attach the watcher to the training (the single place to swap in the Monitor)."""
        checker = InvariantChecker(
            optimizers, model if self.model_known else None,
            emit_event=self.recording.emit_event, emit_status=self.recording.emit_status,
            config=self.config, rank=self.rank,
        )
        self.checkers.append(checker)
        return checker

    def finish(self) -> Recording:
        for checker in self.checkers:
            checker.close()
        return self.recording


@dataclass(frozen=True)
class Case:
    """A training script: healthy (``expect`` empty) or with a bug that starts at ``trigger``."""

    name: str
    train: Callable[[Run], None]
    expect: tuple[str, ...] = ()
    trigger: int = 0
    #: Steps from the trigger to the event: sampled checks run every ``check_every`` (10) steps
    #: and confirm on the next one.
    within: int = 11
    world_size: int = 1

    @property
    def healthy(self) -> bool:
        return not self.expect


@dataclass
class Verdict:
    case: str
    delays: dict[str, int | None]  # expected kind -> steps from trigger to its first event
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems


def run_case(case: Case, model_known: bool = True, config: InvariantConfig | None = None) -> list[Recording]:
    """Run a case in this process, or in ``world_size`` gloo processes; one recording per rank."""
    if case.world_size == 1:
        run = Run(model_known=model_known, config=config)
        case.train(run)
        return [run.finish()]
    return run_distributed([case.name], case.world_size, model_known, config)[case.name]


def judge(case: Case, recordings: Sequence[Recording]) -> Verdict:
    """Did the expected kinds fire within ``case.within`` steps of the trigger, and nothing earlier?"""
    events = [e for r in recordings for e in r.events()]
    alarms = [e for e in events if e["severity"] in ALARM_SEVERITIES]
    problems: list[str] = []
    delays: dict[str, int | None] = {}
    if case.healthy:
        problems += [f"false alarm at step {e['step']} ({e['kind']}): {e['message']}" for e in alarms]
    else:
        early = [e for e in alarms if e["step"] < case.trigger]
        problems += [f"alarm before the trigger, step {e['step']} ({e['kind']}): {e['message']}"
                     for e in early]
        for kind in case.expect:
            steps = sorted(e["step"] for e in events if e["kind"] == kind and e["step"] >= case.trigger)
            delays[kind] = steps[0] - case.trigger if steps else None
            if not steps:
                problems.append(f"{kind} never fired")
            elif delays[kind] > case.within:
                problems.append(f"{kind} fired {delays[kind]} steps after the trigger "
                                f"(allowed {case.within})")
    return Verdict(case.name, delays, problems)


def main(case: Case) -> int:
    """Standalone entry point of a script: run it, print what fired and the verdict."""
    recordings = run_case(case)
    for recording in recordings:
        for m in recording.messages:
            if m["type"] == "event":
                print(f"rank {m['rank']} step {m['step']:>3} EVENT {m['severity']:<8} {m['kind']}: "
                      f"{m['message']}")
        for name, state in final_statuses(recording).items():
            print(f"rank {recording.rank} {name:<26} {state['status']:<9} {state['message']}")
    verdict = judge(case, recordings)
    what = ("healthy run" if case.healthy
            else f"fault at step {case.trigger}, expecting {', '.join(case.expect)}")
    print(f"{case.name}: {what}: " + ("PASS" if verdict.passed else "FAIL"), verdict.delays or "")
    for problem in verdict.problems:
        print("  -", problem)
    return 0 if verdict.passed else 1


def final_statuses(recording: Recording) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for m in recording.messages:
        if m["type"] == "invariant":
            latest[m["name"]] = m
    return latest


# --------------------------------------------------------------------------- several processes


def run_distributed(case_names: Sequence[str], world_size: int = 2, model_known: bool = True,
                    config: InvariantConfig | None = None) -> dict[str, list[Recording]]:
    """Run cases (script module names) one after the other in ``world_size`` gloo processes.

    One set of processes serves all the cases, so starting Python and torch is paid once.
    """
    with tempfile.TemporaryDirectory(prefix="tuimon-faults-") as tmp:
        out = Path(tmp)
        mp.spawn(_worker, args=(world_size, str(out), list(case_names), model_known, config),
                 nprocs=world_size, join=True)
        return {name: [Recording.from_jsonl(out / f"{name}.{rank}.jsonl", rank) for rank in range(world_size)]
                for name in case_names}


def _worker(rank: int, world_size: int, out: str, case_names: list[str], model_known: bool,
            config: InvariantConfig | None) -> None:
    torch.set_num_threads(1)
    if str(FAULTS_DIR) not in sys.path:
        sys.path.insert(0, str(FAULTS_DIR))
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world_size)
    try:
        for name in case_names:
            case: Case = importlib.import_module(name).CASE
            run = Run(rank, world_size, model_known, config, Recording(rank))
            case.train(run)
            run.finish().to_jsonl(Path(out) / f"{name}.{rank}.jsonl")
            dist.barrier()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- models, data, steps


def mlp(sizes: Sequence[int] = (8, 32, 1), dropout: float = 0.0, batch_norm: bool = False,
        seed: int = 0) -> nn.Sequential:
    """Linear layers with ReLU (and optional BatchNorm/Dropout) between them, seeded."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers += [nn.BatchNorm1d(b)] if batch_norm else []
            layers.append(nn.ReLU())
            layers += [nn.Dropout(dropout)] if dropout else []
    return nn.Sequential(*layers)


def batches(steps: int, batch: int = 32, dim: int = 8, out: int = 1, seed: int = 0, noise: float = 0.0,
            dtype: torch.dtype = torch.float32) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
    """``(step, (x, y))`` of a fixed random regression task (a teacher network), deterministic."""
    g = torch.Generator().manual_seed(1000 + seed)
    teacher = torch.randn(dim, out, generator=g) / dim**0.5
    for step in range(steps):
        x = torch.randn(batch, dim, generator=g, dtype=dtype)
        y = torch.tanh(x @ teacher.to(dtype)) + noise * torch.randn(batch, out, generator=g, dtype=dtype)
        yield step, (x, y)


def backward(model: Callable[[torch.Tensor], torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
             scale: float = 1.0) -> torch.Tensor:
    """Forward, mean squared error, backward (scaled, e.g. 1/k for accumulation); returns the loss."""
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    (loss * scale).backward()
    return loss.detach()


def train_step(model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
               batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The textbook step: zero_grad, forward, backward, step."""
    optimizer.zero_grad()
    loss = backward(model, batch)
    optimizer.step()
    return loss


def ddp(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """Wrap for data parallelism on the CPU (gloo); ranks start from the same seeded weights."""
    return nn.parallel.DistributedDataParallel(model)
