"""Shared pieces of the fault and healthy training scripts in this folder.

Every script defines ``CASE = Case(...)`` with a ``train(run)`` function (a small real CPU training
loop, bug included) and ends with ``raise SystemExit(main(CASE))`` so that it runs standalone::

    python tests/faults/fault_missing_zero_grad.py [--record-dir DIR] [--plain]

Scripts build their loop from the helpers here (models, data, one training step), so no two
scripts share copied code.

What a script's training is watched by: :meth:`Run.watch`, the one place that builds the watcher,
a real :class:`~publisher.monitor.Monitor` (detectors, per-layer samples and invariants on)
publishing over ZeroMQ with a JSON Lines recording; :meth:`Run.finish` closes it and reads the
recording back as a :class:`Recording`, on which every assertion is made. A script that reports
its own loss calls :meth:`Run.step` after each optimizer step (as a user calls ``Monitor.step``);
for the others the primary optimizer's step post-hook reports the losses :func:`backward` saw.
With ``--plain`` nothing is watched: ``tuimon run`` instruments the script (zero-code mode).

Steps are the Monitor's: the first optimizer step is step 1. A script's ``trigger`` is the index
(from 0) of the first loop iteration with the fault, i.e. Monitor step ``trigger + 1``.

The tests run the scripts as real subprocesses (:func:`run_batch`: one process runs several
scripts one after the other, so Python and torch start once) or in-process (:func:`run_case`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import itertools
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from publisher.invariants import InvariantConfig
from publisher.monitor import Monitor
from publisher.stats.sampler import StatsConfig

FAULTS_DIR = Path(__file__).resolve().parent
ALARM_SEVERITIES = ("warning", "critical")
T = TypeVar("T")

#: How the scripts' Monitors are set up: no GPU here, and every cost budget pinned so that what is
#: measured, and when, does not depend on how loaded the machine is (the default budgets stretch
#: sampling on slow machines). Memory is read every step: the scripts are short.
MONITOR_OPTIONS: dict[str, Any] = {
    "gpu": "none",
    "grad_norm_budget": 1.0,
    "stats": StatsConfig(budget=1.0),
    "memory_interval_s": 0.0,
}
#: The invariant checks' settings when a case gives none: defaults, budget pinned as above.
PINNED_INVARIANTS = InvariantConfig(budget=1.0)


# --------------------------------------------------------------------------- recording


@dataclass
class Recording:
    """What the watcher published on one rank, as wire messages (``type`` event / invariant / ...)."""

    rank: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    def emit_violation(self, kind: str, severity: str, message: str, step: int, details: dict) -> None:
        """An :class:`InvariantChecker`'s ``emit_violation`` (tests of the checker alone)."""
        self.messages.append({"type": "event", "rank": self.rank, "step": step, "kind": kind,
                              "severity": severity, "message": message, "details": details})

    def emit_status(self, name: str, status: str, step: int | None, message: str, details: dict) -> None:
        """An :class:`InvariantChecker`'s ``emit_status`` (tests of the checker alone)."""
        self.messages.append({"type": "invariant", "rank": self.rank, "step": step, "name": name,
                              "status": status, "message": message, "details": details})

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """One entry per event episode (the latest update of each ``id``), in order of appearance."""
        episodes: dict[Any, dict[str, Any]] = {}
        for n, m in enumerate(self.messages):
            if m["type"] == "event" and kind in (None, m["kind"]):
                episodes[m.get("id", n)] = m
        return list(episodes.values())

    def alarms(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["severity"] in ALARM_SEVERITIES]

    def statuses(self, name: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "invariant" and m["name"] == name]

    def metrics(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "metrics"]

    @classmethod
    def from_jsonl(cls, paths: Path | Iterable[Path], rank: int = 0) -> Recording:
        """The messages of one or more recordings (one per Monitor of the rank), file after file."""
        paths = [paths] if isinstance(paths, Path) else sorted(paths)
        return cls(rank, [json.loads(line) for path in paths
                          for line in path.read_text().splitlines() if line.strip()])


# --------------------------------------------------------------------------- cases

#: The run whose training loop is running in this process: :func:`backward` reports losses to it.
_active: Run | None = None


@dataclass
class Run:
    """One rank's run of a case: which rank, where its recordings go, the Monitors watching it."""

    rank: int = 0
    world_size: int = 1
    model_known: bool = True
    config: InvariantConfig | None = None
    record_dir: Path | None = None
    case_name: str = "case"
    plain: bool = False
    monitors: list[Monitor] = field(default_factory=list)
    _hooks: list[Any] = field(default_factory=list)
    _losses: list[torch.Tensor] = field(default_factory=list)
    _scratch: tempfile.TemporaryDirectory | None = None

    def watch(self, optimizers: Sequence[torch.optim.Optimizer], model: nn.Module | None = None, *,
              manual: bool = False, **options: Any) -> Monitor | None:
        """Attach a Monitor to the training (the single place that builds the watcher).

        ``manual``: the script calls :meth:`step` itself; otherwise the first optimizer's steps are
        reported with the losses :func:`backward` computed since the previous step. ``options``
        override :data:`MONITOR_OPTIONS`. A script may watch several independent models.
        """
        global _active
        _active = self
        if self.plain:
            return None
        if self.record_dir is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="tuimon-faults-")
            self.record_dir = Path(self._scratch.name)
        record = self.record_dir / f"{self.case_name}.{self.rank}.{len(self.monitors)}.jsonl"
        monitor = Monitor(
            model if self.model_known else None, optimizers[0], run=self.case_name, rank=self.rank,
            world_size=self.world_size, record=record, invariants=self.config or PINNED_INVARIANTS,
            **{**MONITOR_OPTIONS, **options},
        )
        for optimizer in optimizers[1:]:
            monitor.add_optimizer(optimizer)
        if not manual:
            self._hooks += _on_each_step(optimizers[0], lambda: self._report(monitor))
        self.monitors.append(monitor)
        return monitor

    def step(self, loss: torch.Tensor | float | None, **measured: Any) -> None:
        """After an optimizer step, in scripts that report their own numbers (``Monitor.step``)."""
        if self.monitors:
            self.monitors[0].step(loss, **measured)

    def track_data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate over the batches, timing each fetch (``Monitor.track_data``)."""
        return self.monitors[0].track_data(iterable) if self.monitors else iter(iterable)

    def note_loss(self, loss: torch.Tensor) -> None:
        self._losses.append(loss)

    def _report(self, monitor: Monitor) -> None:
        losses, self._losses = self._losses, []
        monitor.step(torch.stack(losses).mean() if losses else None)

    def finish(self) -> Recording:
        """Close the Monitors and read back what they recorded."""
        global _active
        _active = None
        for hook in self._hooks:
            hook.remove()
        for monitor in self.monitors:
            monitor.close()
        recording = Recording(self.rank)
        if self.record_dir is not None and self.monitors:
            recording = Recording.from_jsonl(self.record_dir.glob(f"{self.case_name}.{self.rank}.*.jsonl"),
                                             self.rank)
        if self._scratch is not None:
            self._scratch.cleanup()
        return recording


def _on_each_step(optimizer: torch.optim.Optimizer, action: Callable[[], None]) -> list[Any]:
    """Call ``action`` after each ``optimizer.step()``, once: torch runs the hooks of a subclass
    whose ``step`` calls ``super().step()`` twice, nested, once the base class has been used too."""
    depth = [0]

    def before(*_: Any) -> None:
        depth[0] += 1

    def after(*_: Any) -> None:
        depth[0] -= 1
        if depth[0] == 0:
            action()

    return [optimizer.register_step_pre_hook(before), optimizer.register_step_post_hook(after)]


@dataclass(frozen=True)
class Case:
    """A training script: healthy (``expect`` empty) or with a bug from loop index ``trigger`` on
    (Monitor step ``trigger + 1``), to be reported within ``within`` steps."""

    name: str
    train: Callable[[Run], None]
    expect: tuple[str, ...] = ()
    trigger: int = 0
    within: int = 6
    world_size: int = 1

    @property
    def healthy(self) -> bool:
        return not self.expect

    @property
    def first_faulty_step(self) -> int:
        return self.trigger + 1


@dataclass
class Verdict:
    case: str
    delays: dict[str, int | None]  # expected kind -> steps from trigger to its first event
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems


def run_case(case: Case, model_known: bool = True, config: InvariantConfig | None = None,
             record_dir: Path | None = None) -> list[Recording]:
    """Run a case in this process, or in ``world_size`` gloo processes; one recording per rank."""
    if case.world_size == 1:
        run = Run(model_known=model_known, config=config, record_dir=record_dir, case_name=case.name)
        try:
            case.train(run)
        finally:
            recording = run.finish()
        return [recording]
    return run_distributed([case.name], case.world_size, model_known, config)[case.name]


def judge(case: Case, recordings: Sequence[Recording]) -> Verdict:
    """Did the expected kinds fire within ``case.within`` steps of the trigger, and nothing earlier?"""
    events = [e for r in recordings for e in r.events()]
    alarms = [e for e in events if e["severity"] in ALARM_SEVERITIES]
    problems: list[str] = []
    delays: dict[str, int | None] = {}
    first = case.first_faulty_step
    if case.healthy:
        problems += [f"false alarm at step {e['step']} ({e['kind']}): {e['message']}" for e in alarms]
    else:
        early = [e for e in alarms if e["step"] < first]
        problems += [f"alarm before the trigger, step {e['step']} ({e['kind']}): {e['message']}"
                     for e in early]
        for kind in case.expect:
            steps = sorted(e["step"] for e in events if e["kind"] == kind and e["step"] >= first)
            delays[kind] = steps[0] - first if steps else None
            if not steps:
                problems.append(f"{kind} never fired")
            elif delays[kind] > case.within:
                problems.append(f"{kind} fired {delays[kind]} steps after the trigger "
                                f"(allowed {case.within})")
    return Verdict(case.name, delays, problems)


def final_statuses(recording: Recording) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for m in recording.messages:
        if m["type"] == "invariant":
            latest[m["name"]] = m
    return latest


def report(case: Case, recordings: Sequence[Recording]) -> Verdict:
    """Print what fired and the verdict (the standalone scripts' output)."""
    for recording in recordings:
        for m in recording.events():
            print(f"rank {m['rank']} step {m['step']:>3} EVENT {m['severity']:<8} {m['kind']} "
                  f"(x{m.get('count', 1)}): {m['message']}")
        for name, state in final_statuses(recording).items():
            print(f"rank {recording.rank} {name:<26} {state['status']:<9} {state['message']}")
    verdict = judge(case, recordings)
    what = ("healthy run" if case.healthy
            else f"fault at step {case.first_faulty_step}, expecting {', '.join(case.expect)}")
    print(f"{case.name}: {what}: " + ("PASS" if verdict.passed else "FAIL"), verdict.delays or "")
    for problem in verdict.problems:
        print("  -", problem)
    return verdict


def main(case: Case) -> int:
    """Standalone entry point of a script: run it (``--plain``: unwatched), print the verdict."""
    parser = argparse.ArgumentParser(description=f"{case.name}: a tuimon fault-injection script")
    parser.add_argument("--record-dir", type=Path, help="keep the recordings in this folder")
    parser.add_argument("--plain", action="store_true",
                        help="train without watching (for tuimon run, which instruments the script)")
    args = parser.parse_args()
    if args.plain:
        case.train(Run(plain=True, case_name=case.name))
        return 0
    if args.record_dir:
        args.record_dir.mkdir(parents=True, exist_ok=True)
    if case.world_size == 1:
        recordings = run_case(case, record_dir=args.record_dir)
    else:
        recordings = run_distributed([case.name], case.world_size, record_dir=args.record_dir)[case.name]
    return 0 if report(case, recordings).passed else 1


# --------------------------------------------------------------------------- several scripts, processes


def run_batch(case_names: Sequence[str], record_dir: Path) -> None:
    """Run scripts one after the other in this process (2-process cases in one gloo pair), each
    recording into ``record_dir``; a case that crashes leaves ``<name>.error`` with its traceback."""
    single = [n for n in case_names if _load(n).world_size == 1]
    for name in single:
        try:
            run_case(_load(name), record_dir=record_dir)
        except Exception:
            (record_dir / f"{name}.error").write_text(traceback.format_exc())
    for size, names in itertools.groupby(sorted((_load(n).world_size, n) for n in case_names
                                                if _load(n).world_size > 1), key=lambda p: p[0]):
        group = [n for _, n in names]
        try:
            run_distributed(group, size, record_dir=record_dir)
        except Exception:
            for name in group:
                (record_dir / f"{name}.error").write_text(traceback.format_exc())


def recordings_of(name: str, world_size: int, record_dir: Path) -> list[Recording]:
    """The recordings :func:`run_batch` left for one case, one per rank."""
    error = record_dir / f"{name}.error"
    if error.exists():
        raise RuntimeError(f"{name} crashed:\n{error.read_text()}")
    return [Recording.from_jsonl(record_dir.glob(f"{name}.{rank}.*.jsonl"), rank)
            for rank in range(world_size)]


def _load(name: str) -> Case:
    if str(FAULTS_DIR) not in sys.path:
        sys.path.insert(0, str(FAULTS_DIR))
    return importlib.import_module(name).CASE


def run_distributed(case_names: Sequence[str], world_size: int = 2, model_known: bool = True,
                    config: InvariantConfig | None = None, record_dir: Path | None = None
                    ) -> dict[str, list[Recording]]:
    """Run cases (script module names) one after the other in ``world_size`` gloo processes.

    One set of processes serves all the cases, so starting Python and torch is paid once.
    """
    with tempfile.TemporaryDirectory(prefix="tuimon-faults-") as tmp:
        out = record_dir or Path(tmp)
        store = Path(tmp) / f"store-{time.monotonic_ns()}"
        mp.spawn(_worker, args=(world_size, str(out), str(store), list(case_names), model_known, config),
                 nprocs=world_size, join=True)
        return {name: recordings_of(name, world_size, out) for name in case_names}


def _worker(rank: int, world_size: int, out: str, store: str, case_names: list[str], model_known: bool,
            config: InvariantConfig | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        for name in case_names:
            run = Run(rank, world_size, model_known, config, Path(out), name)
            try:
                _load(name).train(run)
            finally:
                run.finish()
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
    return _seen(loss)


def labelled(steps: int, batch: int = 32, dim: int = 16, classes: int = 10, seed: int = 0,
             shuffle_labels: bool = False) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
    """``(step, (x, y))`` of a learnable classification task: the labels of a fixed random linear
    teacher. ``shuffle_labels``: each batch's labels are permuted apart from its inputs (the bug of
    a pipeline that shuffles inputs and labels separately)."""
    g = torch.Generator().manual_seed(2000 + seed)
    teacher = torch.randn(dim, classes, generator=g)
    for step in range(steps):
        x = torch.randn(batch, dim, generator=g)
        y = (x @ teacher).argmax(dim=1)
        if shuffle_labels:
            y = y[torch.randperm(batch, generator=g)]
        yield step, (x, y)


def classify(model: Callable[[torch.Tensor], torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor]
             ) -> torch.Tensor:
    """Forward, cross-entropy, backward; returns the loss (like :func:`backward`)."""
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return _seen(loss)


def _seen(loss: torch.Tensor) -> torch.Tensor:
    """The loss, detached, after telling the active run about it (its next step reports it)."""
    loss = loss.detach()
    if _active is not None:
        _active.note_loss(loss)
    return loss


def train_step(model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
               batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The textbook step: zero_grad, forward, backward, step."""
    optimizer.zero_grad()
    loss = backward(model, batch)
    optimizer.step()
    return loss


def release_free_memory() -> None:
    """Give the memory this process freed back to the system (glibc's ``malloc_trim``), so that a
    script that leaks shows it in its RSS even when an earlier script in the same process freed
    more than it will leak (the allocator would reuse that first)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def ddp(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """Wrap for data parallelism on the CPU (gloo); ranks start from the same seeded weights."""
    return nn.parallel.DistributedDataParallel(model)


if __name__ == "__main__":
    # python tests/faults/_harness.py RECORD_DIR CASE... : the batch runner of tests/test_faults.py.
    # The scripts import this file as ``_harness``: run that module, not this ``__main__`` copy.
    sys.path.insert(0, str(FAULTS_DIR))
    importlib.import_module("_harness").run_batch(sys.argv[2:], Path(sys.argv[1]))
