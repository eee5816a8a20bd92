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

Detection delay is measured from a mark the harness leaves at the trigger to the first message
of an expected event, in steps and seconds, on pinned budgets or (``--defaults``) the Monitor's own;
how, and why, in docs/detectors.md ("How detection delay is measured")::

    python tests/faults/_harness.py --table [--defaults] [NAME...]

The tests run the scripts as real subprocesses (:func:`run_batch`: one process runs several
scripts one after the other, so Python and torch start once) or in-process (:func:`run_case`; a
leak case, ``own_process``, always in a fresh process)::

    python tests/faults/_harness.py --record-dir DIR [--defaults] [--no-model] NAME...   # the batch runner
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import itertools
import json
import subprocess
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

from publisher.detectors.speed import leak_budget
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
#: ``--defaults``: the Monitor as a user gets it (its own budgets, memory every 0.1 s, default
#: invariant settings); only the GPU is off, there is none here.
DEFAULT_OPTIONS: dict[str, Any] = {"gpu": "none"}
#: The kind of the ``info`` event the harness leaves in a fault case's recording where the fault
#: starts (:meth:`Run._mark_trigger`): the origin of the delay in seconds.
TRIGGER_KIND = "fault_trigger"


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
    #: The Monitor's default budgets instead of the pinned ones (:data:`DEFAULT_OPTIONS`).
    defaults: bool = False
    #: A fault case's trigger (loop index of its first faulty iteration); None: healthy.
    fault_from: int | None = None
    monitors: list[Monitor] = field(default_factory=list)
    _hooks: list[Any] = field(default_factory=list)
    _losses: list[torch.Tensor] = field(default_factory=list)
    _scratch: tempfile.TemporaryDirectory | None = None

    def watch(self, optimizers: Sequence[torch.optim.Optimizer], model: nn.Module | None = None, *,
              manual: bool = False, **options: Any) -> Monitor | None:
        """Attach a Monitor to the training (the single place that builds the watcher).

        ``manual``: the script calls :meth:`step` itself; otherwise the first optimizer's steps are
        reported with the losses :func:`backward` computed since the previous step. ``options``
        override :data:`MONITOR_OPTIONS` (or :data:`DEFAULT_OPTIONS` with ``defaults``). A script
        may watch several independent models.
        """
        global _active
        _active = self
        if self.plain:
            return None
        if self.record_dir is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="tuimon-faults-")
            self.record_dir = Path(self._scratch.name)
        record = self.record_dir / f"{self.case_name}.{self.rank}.{len(self.monitors)}.jsonl"
        settings = DEFAULT_OPTIONS if self.defaults else MONITOR_OPTIONS
        invariants = self.config or (True if self.defaults else PINNED_INVARIANTS)
        monitor = Monitor(
            model if self.model_known else None, optimizers[0], run=self.case_name, rank=self.rank,
            world_size=self.world_size, record=record, invariants=invariants, **{**settings, **options},
        )
        for optimizer in optimizers[1:]:
            monitor.add_optimizer(optimizer)
        if not manual:
            self._hooks += _on_each_step(optimizers[0], lambda: self._report(monitor))
        self.monitors.append(monitor)
        if self.fault_from == 0 and len(self.monitors) == 1:
            self._mark_trigger()
        return monitor

    def step(self, loss: torch.Tensor | float | None, **measured: Any) -> None:
        """After an optimizer step, in scripts that report their own numbers (``Monitor.step``)."""
        if self.monitors:
            self.monitors[0].step(loss, **measured)
            self._after_step(self.monitors[0])

    def _after_step(self, monitor: Monitor) -> None:
        if self.fault_from and monitor is self.monitors[0] and monitor.current_step == self.fault_from:
            self._mark_trigger()

    def track_data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate over the batches, timing each fetch (``Monitor.track_data``): pass the DataLoader
        itself, once per epoch, as a user does, so that the Monitor sees the loader and its batches."""
        return self.monitors[0].track_data(iterable) if self.monitors else iter(iterable)

    def _mark_trigger(self) -> None:
        """Where the fault starts, in the recording: an ``info`` event of kind :data:`TRIGGER_KIND`
        at the first faulty step, whose ``ts`` (wall time) the delay in seconds counts from.

        Left by the harness, not the script, so that every case is measured alike: when the watcher
        starts for a bug present from the start, else right after the last healthy step (step
        ``fault_from``: the trigger iteration comes next).
        """
        monitor = self.monitors[0]
        monitor.event(TRIGGER_KIND, "the injected fault starts here", severity="info",
                      step=monitor.current_step + 1)

    def note_loss(self, loss: torch.Tensor) -> None:
        self._losses.append(loss)

    def _report(self, monitor: Monitor) -> None:
        losses, self._losses = self._losses, []
        monitor.step(torch.stack(losses).mean() if losses else None)
        self._after_step(monitor)

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
    (Monitor step ``trigger + 1``), to be reported within ``within`` steps or, when given,
    ``within_s`` seconds (whichever allows more: the target is max(2 steps, 1 s)).

    ``step_s``: the step time the script paces its loop to (:func:`paced`), when it does; the
    targets hold with the Monitor's default budgets on steps of 10 ms or more.
    ``own_process``: :func:`run_batch` runs it in a process of its own, as a training runs: a leak
    measured on the resident set size would otherwise first refill the memory that the scripts
    before it freed (the allocator reuses it), and show late or not at all.
    ``leak``: a leak is also in time when named before the process grew by the detector's leak
    budget (:func:`~publisher.detectors.speed.leak_budget`: 1 GiB or a tenth of the available
    memory) since the trigger: it matters before the machine runs out, not in its first second.
    """

    name: str
    train: Callable[[Run], None]
    expect: tuple[str, ...] = ()
    trigger: int = 0
    within: int = 6
    world_size: int = 1
    within_s: float | None = None
    step_s: float | None = None
    own_process: bool = False
    leak: bool = False

    @property
    def healthy(self) -> bool:
        return not self.expect

    @property
    def first_faulty_step(self) -> int:
        return self.trigger + 1

    @property
    def target(self) -> str:
        """The allowance, as the table shows it."""
        steps = f"{self.within} step{'s' if self.within != 1 else ''}"
        target = steps if self.within_s is None else f"{steps} or {self.within_s:g} s"
        return f"{target} or {leak_budget() / MIB:,.0f} MiB grown" if self.leak else target

    def in_time(self, steps: int, seconds: float | None, grown: float | None = None) -> bool:
        """Within the allowance: ``within`` steps, or ``within_s`` seconds where the case gives it,
        or, for a leak, less memory grown than :func:`leak_budget`."""
        if steps <= self.within:
            return True
        if self.leak and grown is not None and grown < leak_budget():
            return True
        return self.within_s is not None and seconds is not None and seconds <= self.within_s


MIB = 1 << 20


def memory_grown(recordings: Sequence[Recording], since: int, until: int) -> float | None:
    """How much the process's resident set grew from step ``since`` to step ``until``: its last
    ``host_mem_bytes`` reading at or before each (None without readings)."""
    readings = sorted(
        (m["step"], m["metrics"]["host_mem_bytes"]) for r in recordings for m in r.messages
        if m["type"] == "metrics" and "host_mem_bytes" in m.get("metrics", {})
    )
    before = [value for step, value in readings if step <= since]
    at = [value for step, value in readings if step <= until]
    return at[-1] - before[-1] if before and at else None


@dataclass
class Verdict:
    case: str
    delays: dict[str, int | None]  # expected kind -> steps from trigger to its first event
    problems: list[str]
    #: expected kind -> seconds from the trigger to its first event (None: never, or no trigger time)
    seconds: dict[str, float | None] = field(default_factory=dict)
    #: expected kind -> bytes the process grew from the trigger to its first event (leak cases)
    grown: dict[str, float | None] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems


def run_case(case: Case, model_known: bool = True, config: InvariantConfig | None = None,
             record_dir: Path | None = None, defaults: bool = False) -> list[Recording]:
    """Run a case in this process, in a fresh one (``own_process``, default config only), or in
    ``world_size`` gloo processes; one recording per rank."""
    if case.own_process and config is None:
        with contextlib.ExitStack() as stack:
            out = record_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tuimon-case-")))
            error = _spawn([case.name], out, defaults, model_known)
            if error:
                raise RuntimeError(f"{case.name} failed in its own process:\n{error}")
            return recordings_of(case.name, 1, out)
    return _run_here(case, model_known, config, record_dir, defaults)


def _run_here(case: Case, model_known: bool = True, config: InvariantConfig | None = None,
              record_dir: Path | None = None, defaults: bool = False) -> list[Recording]:
    """:func:`run_case` in this process (or, for several ranks, in gloo processes it starts)."""
    if case.world_size == 1:
        run = Run(model_known=model_known, config=config, record_dir=record_dir, case_name=case.name,
                  defaults=defaults, fault_from=None if case.healthy else case.trigger)
        try:
            case.train(run)
        finally:
            recording = run.finish()
        return [recording]
    return run_distributed([case.name], case.world_size, model_known, config, record_dir, defaults)[case.name]


def trigger_time(case: Case, recordings: Sequence[Recording]) -> float | None:
    """Wall time the fault started: the harness's :data:`TRIGGER_KIND` mark; in a recording without
    one, the end of the last healthy step (``ts`` of step ``trigger``'s metrics) or, for a bug
    present from the start, the run's start."""
    messages = [m for r in recordings for m in r.messages]
    for wanted in (lambda m: m["type"] == "event" and m["kind"] == TRIGGER_KIND,
                   lambda m: case.trigger > 0 and m["type"] == "metrics" and m.get("step") == case.trigger,
                   lambda m: case.trigger == 0 and m["type"] == "run_start"):
        times = [m["ts"] for m in messages if wanted(m)]
        if times:
            return min(times)
    return None


def judge(case: Case, recordings: Sequence[Recording]) -> Verdict:
    """Did the expected kinds fire within ``case.within`` steps (or ``within_s`` seconds) of the
    trigger, and nothing earlier?"""
    events = [e for r in recordings for e in r.events()]
    alarms = [e for e in events if e["severity"] in ALARM_SEVERITIES]
    problems: list[str] = []
    delays: dict[str, int | None] = {}
    seconds: dict[str, float | None] = {}
    grown: dict[str, float | None] = {}
    first = case.first_faulty_step
    if case.healthy:
        problems += [f"false alarm at step {e['step']} ({e['kind']}): {e['message']}" for e in alarms]
    else:
        early = [e for e in alarms if e["step"] < first]
        problems += [f"alarm before the trigger, step {e['step']} ({e['kind']}): {e['message']}"
                     for e in early]
        start = trigger_time(case, recordings)
        for kind in case.expect:
            # Every message of the kind's episodes: an update keeps the episode's first step, so
            # the earliest message is the first report.
            hits = [m for r in recordings for m in r.messages if m["type"] == "event" and m["kind"] == kind
                    and m.get("step") is not None and m["step"] >= first]
            if not hits:
                delays[kind] = seconds[kind] = None
                problems.append(f"{kind} never fired")
                continue
            steps = delays[kind] = min(m["step"] for m in hits) - first
            late = seconds[kind] = None if start is None else min(m["ts"] for m in hits) - start
            leaked = grown[kind] = memory_grown(recordings, first - 1, first + steps) if case.leak else None
            if not case.in_time(steps, late, leaked):
                after = f"{steps} steps" + ("" if late is None else f" ({late:.2f} s)")
                after += "" if leaked is None else f", {leaked / MIB:,.0f} MiB grown"
                problems.append(f"{kind} fired {after} after the trigger (allowed {case.target})")
    return Verdict(case.name, delays, problems, seconds, grown)


def delay_rows(case: Case, verdict: Verdict) -> list[tuple[str, ...]]:
    """One row per expected kind of a fault case: case, kind, delay in steps and seconds, target,
    result (``pass``, ``LATE``, ``NEVER``; ``EARLY`` when an alarm came before the trigger)."""
    if case.healthy:  # a healthy case named to --table: its row says whether it stayed quiet
        fired = sorted({p.split("(", 1)[1].split(")", 1)[0] for p in verdict.problems})
        return [(case.name, "(no alarm)", "-", "-", "-", "ALARM " + ",".join(fired) if fired else "pass")]
    early = any(p.startswith("alarm before") for p in verdict.problems)
    rows = []
    for kind in case.expect:
        steps, seconds, grown = verdict.delays.get(kind), verdict.seconds.get(kind), verdict.grown.get(kind)
        result = ("NEVER" if steps is None else "LATE" if not case.in_time(steps, seconds, grown)
                  else "EARLY" if early else "pass")
        rows.append((case.name, kind, "-" if steps is None else str(steps),
                     "-" if seconds is None else f"{seconds:.2f}", case.target, result))
    return rows


def delay_table(rows: Sequence[Sequence[str]], title: str = "") -> str:
    """The detection delays as a text table (the suite prints it; ``--table`` too)."""
    header = ("case", "expected", "delay (steps)", "delay (s)", "target", "result")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [title] if title else []
    for row in [header, *rows]:
        cells = (str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
    passed = sum(r[-1] == "pass" for r in rows)
    lines.append(f"{passed} of {len(rows)} within target")
    return "\n".join(lines)


def budgets_title(defaults: bool) -> str:
    return ("detection delays, the Monitor's default budgets (memory every 0.1 s)" if defaults
            else "detection delays, budgets pinned (sampling budgets 1.0, memory every step)")


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
    what = ("healthy run" if case.healthy else f"fault at step {case.first_faulty_step}, expecting "
            f"{', '.join(case.expect)} within {case.target}")
    delays = {kind: f"{steps} steps" + ("" if verdict.seconds.get(kind) is None
                                        else f", {verdict.seconds[kind]:.2f} s")
              for kind, steps in verdict.delays.items() if steps is not None}
    print(f"{case.name}: {what}: " + ("PASS" if verdict.passed else "FAIL"), delays or "")
    for problem in verdict.problems:
        print("  -", problem)
    return verdict


def main(case: Case) -> int:
    """Standalone entry point of a script: run it (``--plain``: unwatched), print the verdict."""
    parser = argparse.ArgumentParser(description=f"{case.name}: a tuimon fault-injection script")
    parser.add_argument("--record-dir", type=Path, help="keep the recordings in this folder")
    parser.add_argument("--plain", action="store_true",
                        help="train without watching (for tuimon run, which instruments the script)")
    parser.add_argument("--defaults", action="store_true",
                        help="the Monitor's default budgets instead of the pinned ones")
    args = parser.parse_args()
    if args.plain:
        case.train(Run(plain=True, case_name=case.name))
        return 0
    if args.record_dir:
        args.record_dir.mkdir(parents=True, exist_ok=True)
    # A script run standalone is a process of its own already.
    recordings = _run_here(case, record_dir=args.record_dir, defaults=args.defaults)
    return 0 if report(case, recordings).passed else 1


# --------------------------------------------------------------------------- several scripts, processes


def run_batch(case_names: Sequence[str], record_dir: Path, defaults: bool = False,
              model_known: bool = True, shared: bool = False) -> None:
    """Run scripts one after the other in this process (2-process cases in one gloo pair; an
    ``own_process`` case, among others, in a process of its own), each recording into
    ``record_dir``; a case that crashes leaves ``<name>.error`` with its traceback.

    ``shared``: other processes work through the same list into the same folder; each one-process
    script is run by the first process to claim it (a file created once), so that the processes
    share the work as it comes, however long each script takes."""
    # The longest first (a process of their own, then paced steps), so that sharing ends even.
    single = sorted((n for n in case_names if _load(n).world_size == 1),
                    key=lambda n: (not _load(n).own_process, _load(n).step_s is None))
    for name in single:
        if shared and _taken(name, record_dir):
            continue
        if _load(name).own_process and len(case_names) > 1:
            error = _spawn([name], record_dir, defaults, model_known)
            if error:
                (record_dir / f"{name}.error").write_text(error)
            continue
        try:
            _run_here(_load(name), model_known, record_dir=record_dir, defaults=defaults)
        except Exception:
            (record_dir / f"{name}.error").write_text(traceback.format_exc())
    for size, names in itertools.groupby(sorted((_load(n).world_size, n) for n in case_names
                                                if _load(n).world_size > 1), key=lambda p: p[0]):
        group = [n for _, n in names]
        try:
            run_distributed(group, size, record_dir=record_dir, defaults=defaults)
        except Exception:
            for name in group:
                (record_dir / f"{name}.error").write_text(traceback.format_exc())


def _taken(name: str, record_dir: Path) -> bool:
    """Claim ``name`` for this process: False the first time any process asks, True after."""
    try:
        (record_dir / f"{name}.claim").touch(exist_ok=False)
    except FileExistsError:
        return True
    return False


def _spawn(case_names: Sequence[str], record_dir: Path, defaults: bool, model_known: bool) -> str:
    """:func:`run_batch` in a new Python process; what it printed if it failed, else ``""``."""
    options = [*(["--defaults"] if defaults else []), *([] if model_known else ["--no-model"])]
    done = subprocess.run([sys.executable, __file__, "--record-dir", str(record_dir), *options, *case_names],
                          capture_output=True, text=True, cwd=FAULTS_DIR)
    return done.stdout + done.stderr if done.returncode else ""


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
                    config: InvariantConfig | None = None, record_dir: Path | None = None,
                    defaults: bool = False) -> dict[str, list[Recording]]:
    """Run cases (script module names) one after the other in ``world_size`` gloo processes.

    One set of processes serves all the cases, so starting Python and torch is paid once.
    """
    with tempfile.TemporaryDirectory(prefix="tuimon-faults-") as tmp:
        out = record_dir or Path(tmp)
        store = Path(tmp) / f"store-{time.monotonic_ns()}"
        mp.spawn(_worker, args=(world_size, str(out), str(store), list(case_names), model_known, config,
                                defaults), nprocs=world_size, join=True)
        return {name: recordings_of(name, world_size, out) for name in case_names}


def _worker(rank: int, world_size: int, out: str, store: str, case_names: list[str], model_known: bool,
            config: InvariantConfig | None, defaults: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        for name in case_names:
            case = _load(name)
            run = Run(rank, world_size, model_known, config, Path(out), name, defaults=defaults,
                      fault_from=None if case.healthy else case.trigger)
            try:
                case.train(run)
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
             shuffle_labels: bool = False, scale: float = 1.0
             ) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
    """``(step, (x, y))`` of a learnable classification task: the labels of a fixed random linear
    teacher. ``shuffle_labels``: each batch's labels are permuted apart from its inputs (the bug of
    a pipeline that shuffles inputs and labels separately). ``scale``: inputs that many times larger
    (features left unnormalised: gradient norms of 1-3 with :func:`mlp`, worth clipping at 1)."""
    g = torch.Generator().manual_seed(2000 + seed)
    teacher = torch.randn(dim, classes, generator=g)
    for step in range(steps):
        x = torch.randn(batch, dim, generator=g) * scale
        y = (x @ teacher).argmax(dim=1)
        if shuffle_labels:
            y = y[torch.randperm(batch, generator=g)]
        yield step, (x, y)


def classify(model: Callable[[torch.Tensor], torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor],
             scale: float = 1.0) -> torch.Tensor:
    """Forward, cross-entropy, backward (scaled, as in :func:`backward`); returns the loss."""
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    (loss * scale).backward()
    return _seen(loss)


def fit(model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
        batch: tuple[torch.Tensor, torch.Tensor],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """zero_grad, forward, ``loss(output, target)`` (``F.cross_entropy``, looked up at the call as a
    script's own call would be), backward, step; returns the loss."""
    x, y = batch
    optimizer.zero_grad()
    value = (loss or nn.functional.cross_entropy)(model(x), y)
    value.backward()
    optimizer.step()
    return _seen(value)


def cnn(classes: int = 10, seed: int = 0, head: nn.Module | None = None) -> nn.Sequential:
    """A tiny convolutional classifier of 1x8x8 images, seeded; ``head``: a layer after the logits
    (a bug's ``Softmax``)."""
    torch.manual_seed(seed)
    layers = [nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
              nn.Linear(128, classes)]
    return nn.Sequential(*layers, *([head] if head is not None else []))


def images(count: int, classes: int = 10, seed: int = 0) -> torch.utils.data.TensorDataset:
    """``count`` 1x8x8 images in random class order: a fixed random pattern per class, plus noise."""
    g = torch.Generator().manual_seed(3000 + seed)
    patterns = torch.randn(classes, 1, 8, 8, generator=g)
    y = torch.randint(classes, (count,), generator=g)
    return torch.utils.data.TensorDataset(patterns[y] + 0.8 * torch.randn(count, 1, 8, 8, generator=g), y)


def sorted_by_class(data: torch.utils.data.TensorDataset) -> torch.utils.data.TensorDataset:
    """The same examples stored class by class (as an ``ImageFolder`` lists them)."""
    x, y = data.tensors
    order = torch.argsort(y, stable=True)
    return torch.utils.data.TensorDataset(x[order], y[order])


class TinyTransformer(nn.Module):
    """A one-layer transformer encoder that classifies token sequences (mean-pooled), seeded."""

    def __init__(self, vocab: int = 32, classes: int = 4, dim: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0,
                                                  batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def token_labels(steps: int, batch: int = 32, length: int = 8, vocab: int = 32, classes: int = 4,
                 seed: int = 0) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
    """``(step, (tokens, y))``: random sequences labelled by their first token (mod ``classes``)."""
    g = torch.Generator().manual_seed(4000 + seed)
    for step in range(steps):
        tokens = torch.randint(vocab, (batch, length), generator=g)
        yield step, (tokens, tokens[:, 0] % classes)


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


def paced(items: Iterable[T], step_s: float) -> Iterator[T]:
    """``items``, the next one no sooner than ``step_s`` after the previous was handed out: the loop's
    steps take what a real model's would (10 ms or more), however little the tiny model here costs;
    a slower iteration is not padded. Wrap :meth:`Run.track_data` with it, not the other way round
    (the pause is not time spent waiting for data)."""
    due = time.perf_counter()
    for item in items:
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        due = time.perf_counter() + step_s
        yield item


class TiedLM(nn.Module):
    """A tiny language model whose output head is the embedding matrix (weight tying, as in GPT-2):
    ``head.weight is embed.weight``, one tensor trained through both uses."""

    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def token_batches(steps: int, batch: int = 8, length: int = 12, vocab: int = 50, seed: int = 0
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """``(step, tokens)``: sequences that count up in strides (learnable: the next token follows
    from the current one), from random starts."""
    g = torch.Generator().manual_seed(3000 + seed)
    for step in range(steps):
        starts = torch.randint(0, vocab, (batch, 1), generator=g)
        strides = torch.randint(1, 4, (batch, 1), generator=g)
        yield step, (starts + strides * torch.arange(length)) % vocab


def predict_next(model: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, backward; returns the loss (like :func:`backward`)."""
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    return _seen(loss)


def regression_set(size: int, dim: int = 8, seed: int = 0) -> torch.utils.data.TensorDataset:
    """A fixed regression data set of ``size`` samples (for DataLoaders: an epoch is one pass)."""
    g = torch.Generator().manual_seed(4000 + seed)
    x = torch.randn(size, dim, generator=g)
    return torch.utils.data.TensorDataset(x, torch.tanh(x.sum(dim=1, keepdim=True) / dim**0.5))


class Procedural(torch.utils.data.Dataset):
    """A data set whose samples are made on the fly from the process's random generator (synthetic
    data, random augmentation): what a DataLoader worker yields depends on how its generator was
    seeded, not on the index it was asked for."""

    def __init__(self, size: int, dim: int = 8) -> None:
        self.size = size
        self.teacher = torch.randn(dim, 1, generator=torch.Generator().manual_seed(5)) / dim**0.5

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.teacher.shape[0])
        return x, torch.tanh(x @ self.teacher)


class Images(torch.utils.data.Dataset):
    """``size`` noisy ``3 x side x side`` images of ten classes, each with its label, made when asked
    (in a DataLoader worker: an augmentation pipeline); each class a faint pattern under the noise,
    so that there is something to learn and it takes a while."""

    def __init__(self, size: int, side: int = 64) -> None:
        self.size = size
        self.patterns = 0.1 * torch.randn(10, 3, side, side, generator=torch.Generator().manual_seed(7))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = index % 10
        return torch.randn(self.patterns.shape[1:]) + self.patterns[label], torch.tensor(label)


def release_free_memory() -> None:
    """Give the memory this process freed back to the system (glibc's ``malloc_trim``), so that a
    script that leaks shows it in its RSS even when an earlier script in the same process freed
    more than it will leak (the allocator would reuse that first)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def ddp(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    """Wrap for data parallelism on the CPU (gloo); ranks start from the same seeded weights."""
    return nn.parallel.DistributedDataParallel(model)


def fault_names() -> list[str]:
    """Every fault script in this folder, by name."""
    return sorted(p.stem for p in FAULTS_DIR.glob("fault_*.py"))


def tabulate(case_names: Sequence[str], record_dir: Path, defaults: bool = False) -> tuple[str, bool]:
    """The delay table of the cases whose recordings are in ``record_dir``, and whether all passed.
    A case that crashed shows ``CRASH`` (its traceback is in ``<name>.error``)."""
    rows: list[tuple[str, ...]] = []
    passed = True
    for name in case_names:
        case = _load(name)
        try:
            verdict = judge(case, recordings_of(name, case.world_size, record_dir))
        except RuntimeError:
            rows += [(name, kind, "-", "-", case.target, "CRASH") for kind in case.expect or ("(no alarm)",)]
            passed = False
            continue
        rows += delay_rows(case, verdict)
        passed = passed and verdict.passed
    return delay_table(rows, budgets_title(defaults)), passed


def _cli(argv: Sequence[str]) -> int:
    """``--record-dir DIR NAME...``: the tests' batch runner (recordings only); ``--table``: run
    the fault scripts named (all by default) and print their detection delays."""
    parser = argparse.ArgumentParser(description="run fault-injection scripts in one process")
    parser.add_argument("names", nargs="*", help="script names (default with --table: every fault_*)")
    parser.add_argument("--record-dir", type=Path, help="where the recordings go (kept)")
    parser.add_argument("--table", action="store_true", help="print the detection-delay table")
    parser.add_argument("--defaults", action="store_true",
                        help="the Monitor's default budgets instead of the pinned ones")
    parser.add_argument("--shared", action="store_true",
                        help="other processes run the same scripts into the same --record-dir: each "
                        "one-process script is run by the first to claim it")
    parser.add_argument("--no-model", action="store_true",
                        help="the Monitor is not given the model (it finds it at a forward)")
    args = parser.parse_args(argv)
    if not args.table:
        if args.record_dir is None:
            parser.error("--record-dir is needed without --table")
        run_batch(args.names, args.record_dir, args.defaults, model_known=not args.no_model,
                  shared=args.shared)
        return 0
    names = args.names or fault_names()
    with tempfile.TemporaryDirectory(prefix="tuimon-faults-") as tmp:
        out = args.record_dir or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        run_batch(names, out, args.defaults)
        table, passed = tabulate(names, out, args.defaults)
    print(table)
    return 0 if passed else 1


if __name__ == "__main__":
    # The scripts import this file as ``_harness``: run that module, not this ``__main__`` copy.
    sys.path.insert(0, str(FAULTS_DIR))
    raise SystemExit(importlib.import_module("_harness")._cli(sys.argv[1:]))
