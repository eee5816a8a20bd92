"""What each framework callback costs: training steps with and without ``TuimonCallback``, in one run.

    python benchmarks/callbacks.py [--steps 400] [--warmup 150] [--repeats 7] [--frameworks hf,lightning]

For each framework the same tiny GPT-2 (:class:`Gpt2Size`: built from a local config, nothing is
downloaded; ~20 ms a step on one core of this machine's CPU) trains ``--steps`` optimizer steps on
learnable token rows, once without and once with a ``TuimonCallback(gpu="none")`` (no recording,
the default loopback endpoint, everything else a default Monitor does: detectors, invariants,
per-layer samples), ``--repeats`` times, in ABBA order (baseline first in even repeats, monitored
first in odd ones) so that a shared machine's drift hits both arms alike, as
``benchmarks/overhead.py`` does. A fresh model, optimizer and Trainer every run, seeded alike.

- ``hf``: ``transformers.Trainer`` with :mod:`publisher.integrations.transformers`;
- ``lightning``: ``lightning.Trainer`` with :mod:`publisher.integrations.lightning`;
- ``plain``: a hand-written loop calling ``Monitor.step`` (the reference the callbacks add to).

Printed per framework: the step time without and with the callback (median over repeats of each
run's mean step time: a median per run would drop the steps the Monitor's background bursts
delay, ``blocks.py``), ``ratio``, the median over repeats of (with / without) of the two runs of
a repeat, which a machine whose load changes during the run disturbs less than a ratio of
overall medians, and its ``spread`` (the smallest and largest of those per-repeat ratios);
``cpu``, the same median ratio for the process's CPU time per step (every thread: the Monitor's
step worker and publisher included), which other programs on a shared machine disturb less than
wall time (a slowed run takes longer, not more CPU). These are the steady cost, over the steps
after the first ``--warmup``; ``first``, the extra time those first steps took (median over
repeats, with minus without), is the start's one-off cost: a fresh Monitor samples every layer and
checks every invariant on its first steps, looks at every loss call until it knows the labels'
prior (48 calls on this model: ~1 ms each on this CPU), and its cost budgets are still measuring,
so its first ~150 steps cost it more than the next (``--phases`` prints the ratio by bands of
steps); with the 10-step warm-up this benchmark had before, that start was read as a per-step cost.

Target: 1.02x (README, "What monitoring costs"). The callback is a Monitor, and the
callbacks' own work per step (a forward hook, a loss queued on its device) is a few
microseconds, so ``hf`` and ``lightning`` should read like ``plain``.

What is timed, and why not the Trainer's own ``train_runtime``: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import itertools
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from blocks import (
    STEAL_LIMIT,
    Steal,
    add_steal_option,
    add_threads_option,
    arms,
    calm,
    chosen,
    flush_subnormals,
    middle_half,
    pair_ratio,
    thread_counts,
)
from helpers import tiny_lm  # the tests' model and data (tests/helpers/tiny_lm.py)
from helpers.tiny_lm import LmRows

from publisher.integrations.session import AUTOSTART_ENV
from publisher.monitor import Monitor

FRAMEWORKS = ("hf", "lightning", "plain")
#: What every arm's Monitor is told, as a user of the callback would: no GPU readings (this is a CPU
#: benchmark; NVML or a simulation would add a sampler thread to one arm only), no recording.
CALLBACK_OPTIONS: dict[str, Any] = {"gpu": "none"}


@dataclass(frozen=True)
class Gpt2Size:
    """The tiny GPT-2 and its batches: ~20 ms a plain forward-backward-AdamW step on one core of
    a 2-core shared VM (measured), inside the 10-30 ms a benchmark of per-step costs wants."""

    layers: int = 2
    width: int = 64
    heads: int = 4
    vocab: int = 256
    length: int = 32
    batch: int = 8
    lr: float = 3e-3


SIZE = Gpt2Size()


def tiny_gpt2(size: Gpt2Size = SIZE) -> torch.nn.Module:
    """The tests' tiny GPT-2 (``tests/helpers/tiny_lm.py``) at this benchmark's size."""
    return tiny_lm.tiny_gpt2(layers=size.layers, width=size.width, heads=size.heads, vocab=size.vocab,
                             positions=size.length)


def token_rows(count: int, size: Gpt2Size = SIZE) -> torch.Tensor:
    """Learnable rows, so the run stays healthy: random tokens would sit at chance, and the
    ``chance_loss`` event would make the monitored arm publish more than a healthy run does."""
    return tiny_lm.token_rows(count, vocab=size.vocab, length=size.length)


class Stamps:
    """The clock at the end of each optimizer step; ``watched`` says whether a Monitor was live."""

    def __init__(self, monitor_of: Callable[[], Monitor | None] | None = None) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []  # the process's CPU time (every thread), at the same points
        self._monitor_of = monitor_of
        self.watched = False

    def stamp(self) -> None:
        self.times.append(time.perf_counter())
        self.cpu.append(time.process_time())
        if self._monitor_of is not None and len(self.times) == 1:
            self.watched = self._monitor_of() is not None

    def step_times(self) -> list[float]:
        """Intervals between stamps: every step's time but the first's (no stamp before it)."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    def cpu_per_step(self, first: int) -> float:
        """CPU seconds of the whole process per step over the steps from interval ``first`` on."""
        return (self.cpu[-1] - self.cpu[first]) / max(1, len(self.cpu) - 1 - first)

    @property
    def span(self) -> float:
        return self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0


@dataclass
class Run:
    all_times: list[float]  # every step's time, the first ones included (``--phases``)
    first: int  # the first of them past ``--warmup``
    cpu_s: float  # CPU seconds of the process per step past ``--warmup`` (all threads: the Monitor's too)
    fixed_s: float  # the whole train()/fit() call minus its steps' span

    @property
    def step_times(self) -> list[float]:
        """The steps the ratio is taken over: those past ``--warmup``."""
        return self.all_times[self.first:]

    @property
    def early_s(self) -> float:
        """The time of the first ``--warmup`` steps, left out of :attr:`step_times`: with a
        Monitor, the start's own work (every layer sampled and invariant checked on the first
        steps, every loss call looked at until the label prior is made, the cost budgets still
        measuring)."""
        return sum(self.all_times[:self.first])


# ----------------------------------------------------------------------------- the three loops


def run_hf(steps: int, monitored: bool, workdir: Path) -> Stamps:
    """``transformers.Trainer.train()`` of ``steps`` optimizer steps (no logging, evaluation or saving)."""
    import transformers

    from publisher.integrations.transformers import TuimonCallback

    class Timer(transformers.TrainerCallback):
        def __init__(self, stamps: Stamps) -> None:
            self.stamps = stamps

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.stamps.stamp()

    tuimon = TuimonCallback(run="bench-hf", **CALLBACK_OPTIONS) if monitored else None
    stamps = Stamps(None if tuimon is None else lambda: tuimon.monitor)
    args = transformers.TrainingArguments(
        output_dir=str(workdir / "hf"), max_steps=steps, per_device_train_batch_size=SIZE.batch,
        learning_rate=SIZE.lr, logging_strategy="no", eval_strategy="no", save_strategy="no",
        report_to=[], dataloader_num_workers=0, use_cpu=True, disable_tqdm=True, seed=0,
    )
    callbacks = [c for c in (tuimon, Timer(stamps)) if c is not None]  # the timer after the callback
    trainer = transformers.Trainer(model=tiny_gpt2(), args=args, callbacks=callbacks,
                                   train_dataset=LmRows(token_rows(steps * SIZE.batch)))
    trainer.remove_callback(transformers.PrinterCallback)  # prints the final metrics otherwise
    trainer.train()
    return stamps


def run_lightning(steps: int, monitored: bool, workdir: Path) -> Stamps:
    """``lightning.Trainer.fit()`` of ``steps`` optimizer steps (no validation, logger or checkpoints)."""
    import lightning.pytorch as pl

    from publisher.integrations.lightning import TuimonCallback

    class TinyLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_gpt2()

        def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=SIZE.lr)

    class Timer(pl.Callback):
        def __init__(self, stamps: Stamps) -> None:
            self.stamps = stamps

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, index: int) -> None:
            self.stamps.stamp()

    tuimon = TuimonCallback(run="bench-lightning", **CALLBACK_OPTIONS) if monitored else None
    stamps = Stamps(None if tuimon is None else lambda: tuimon.monitor)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, default_root_dir=str(workdir / "lightning"),
        callbacks=[c for c in (tuimon, Timer(stamps)) if c is not None],
    )
    loader = torch.utils.data.DataLoader(token_rows(steps * SIZE.batch), batch_size=SIZE.batch)
    trainer.fit(TinyLM(), loader)
    return stamps


def run_plain(steps: int, monitored: bool, workdir: Path) -> Stamps:
    """A hand-written loop: the same model, optimizer and batches, ``Monitor.step`` after each step."""
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=SIZE.lr)
    loader = torch.utils.data.DataLoader(token_rows(steps * SIZE.batch), batch_size=SIZE.batch)
    with contextlib.ExitStack() as stack:
        mon = (stack.enter_context(Monitor(model, optimizer, run="bench-plain", **CALLBACK_OPTIONS))
               if monitored else None)
        stamps = Stamps(None if mon is None else lambda: mon)
        for batch in loader:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            if mon is not None:
                mon.step(loss.detach(), samples=batch.shape[0], tokens=batch.numel())
            optimizer.zero_grad()
            stamps.stamp()
    return stamps


RUNNERS: dict[str, Callable[[int, bool, Path], Stamps]] = {
    "hf": run_hf, "lightning": run_lightning, "plain": run_plain,
}
#: What each framework needs installed, for a clear skip where it is not.
NEEDS = {"hf": ("transformers", "accelerate"), "lightning": ("transformers", "lightning"),
         "plain": ("transformers",)}


def timed_run(framework: str, steps: int, monitored: bool, warmup: int, threads: int) -> Run:
    """One training run in a scratch folder; raises if the monitored arm had no live Monitor."""
    torch.set_num_threads(threads)  # a framework may change it; every run starts alike
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        stamps = RUNNERS[framework](steps, monitored, Path(workdir))
        total = time.perf_counter() - started
    if len(stamps.times) != steps:
        raise RuntimeError(f"{framework}: {len(stamps.times)} steps stamped, {steps} asked for")
    if monitored and not stamps.watched:
        raise RuntimeError(f"{framework}: the monitored arm ran without a Monitor")
    first = max(0, warmup - 1)
    return Run(stamps.step_times(), first, stamps.cpu_per_step(first), total - stamps.span)


#: Bands of steps (from, to) whose ratios ``--phases`` prints: how the start's extra cost fades.
PHASES = ((10, 20), (20, 40), (40, 60), (60, 100), (100, 150), (150, 250), (250, 400))


def measure(framework: str, steps: int, repeats: int, warmup: int, threads: int,
            steal_limit: float = STEAL_LIMIT) -> dict[str, Any]:
    """``repeats`` ABBA pairs of runs, after one short discarded pair (imports, first allocations);
    the ratio over the calm pairs (``blocks.calm``: the host took at most ``steal_limit`` of the
    machine's CPU time during either run)."""
    for monitored in (False, True):
        timed_run(framework, max(warmup + 2, 5), monitored, 0, threads)
    means: dict[bool, list[float]] = {False: [], True: []}
    fixed: dict[bool, list[float]] = {False: [], True: []}
    early: dict[bool, list[float]] = {False: [], True: []}
    ratios: list[float] = []
    pair_steals: list[list[float | None]] = []  # per pair: each run's steal
    cpu_ratios: list[float] = []
    phases: dict[tuple[int, int], list[float]] = {band: [] for band in PHASES if band[1] <= steps}
    for repeat in range(repeats):
        step_times: dict[bool, list[float]] = {}
        every_step: dict[bool, list[float]] = {}
        cpu: dict[bool, float] = {}
        steals: list[float | None] = []
        for monitored in arms(repeat):
            steal = Steal()
            run = timed_run(framework, steps, monitored, warmup, threads)
            steals.append(steal.share())
            step_times[monitored] = run.step_times
            every_step[monitored] = run.all_times
            cpu[monitored] = run.cpu_s
            means[monitored].append(statistics.fmean(run.step_times))
            fixed[monitored].append(run.fixed_s)
            early[monitored].append(run.early_s)
        ratios.append(pair_ratio(step_times[True], step_times[False]))
        pair_steals.append(steals)
        cpu_ratios.append(cpu[True] / cpu[False])
        for low, high in phases:
            phases[low, high].append(pair_ratio(every_step[True][low:high], every_step[False][low:high]))
    kept = calm(ratios, pair_steals, steal_limit)
    return {
        "without_ms": statistics.median(means[False]) * 1e3,
        "with_ms": statistics.median(means[True]) * 1e3,
        "ratio": middle_half(kept)[1],
        "calm": len(kept),
        "low": min(ratios),
        "high": max(ratios),
        "cpu": statistics.median(cpu_ratios),
        "fixed_ms": (statistics.median(fixed[True]) - statistics.median(fixed[False])) * 1e3,
        "early_ms": (statistics.median(early[True]) - statistics.median(early[False])) * 1e3,
        "phases": {band: statistics.median(ratios) for band, ratios in phases.items()},
    }


@contextlib.contextmanager
def quiet_frameworks() -> Iterator[None]:
    """The frameworks' banners and advice (devices found, no logger, few dataloader workers) off:
    the same in both arms, and they would bury the table."""
    names = ("lightning.pytorch", "lightning.fabric", "transformers")
    for name in names:  # imported first: Lightning sets its loggers' levels when imported
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def missing(framework: str) -> list[str]:
    return [name for name in NEEDS[framework] if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps a run (default 400)")
    parser.add_argument("--repeats", type=int, default=7, help="ABBA pairs of runs a framework (default 7)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma-separated, of {', '.join(FRAMEWORKS)} (default all)")
    parser.add_argument("--warmup", type=int, default=150,
                        help="steps at the start of each run left out of the ratio, their extra time "
                             "printed apart (default 150)")
    add_threads_option(parser)
    parser.add_argument("--phases", action="store_true",
                        help="also print the ratio over bands of steps from the start (its cost fading)")
    add_steal_option(parser)
    args = parser.parse_args(argv)
    frameworks = chosen(parser, "--frameworks", args.frameworks, list(FRAMEWORKS))
    if args.steps < args.warmup + 10 or args.repeats < 1:
        parser.error("--steps must be at least --warmup + 10, --repeats at least 1")
    if os.environ.get(AUTOSTART_ENV) == "1":
        parser.error("under `tuimon run` the callbacks stand aside: run this benchmark directly")
    counts = thread_counts(parser, args.threads)
    flush_subnormals()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; tiny GPT-2 {SIZE}.")
    print(f"{args.steps} steps a run, the first {args.warmup} left out; {args.repeats} ABBA pairs a"
          " framework. Step times are runs' means; ratio is the median over calm pairs (the host took at"
          f" most {args.steal_limit:g} of the CPU time during either run) of (with / without), calm their"
          " count, spread the range over every pair.")
    columns = {"without": 10, "with": 10, "ratio": 8, "calm": 7, "spread": 15, "cpu": 8, "first": 10,
               "start+end": 12}
    header = f"{'framework':<11}" + "".join(f"{name:>{width}}" for name, width in columns.items())
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as runtime, quiet_frameworks():
        os.environ["TUIMON_RUNTIME_DIR"] = runtime  # the runs' registry entries, not the user's
        for threads, framework in itertools.product(counts, frameworks):
            if framework == frameworks[0]:
                print(f"at {threads} torch thread(s)")
                print(header)
                print("-" * len(header))
            absent = missing(framework)
            if absent:
                print(f"{framework:<11}skipped: {', '.join(absent)} not installed", flush=True)
                continue
            r = measure(framework, args.steps, args.repeats, args.warmup, threads, args.steal_limit)
            calm_pairs = f"{r['calm']}/{args.repeats}"
            print(f"{framework:<11}{r['without_ms']:>8.2f}ms{r['with_ms']:>8.2f}ms{r['ratio']:>8.3f}{calm_pairs:>7}"
                  f"{r['low']:>8.3f}-{r['high']:.3f}{r['cpu']:>8.3f}{r['early_ms']:>+8.0f}ms"
                  f"{r['fixed_ms']:>+10.0f}ms", flush=True)
            if args.phases:
                print(" " * 11 + "by steps: " + ", ".join(
                    f"{low}-{high} {ratio:.3f}" for (low, high), ratio in r["phases"].items()), flush=True)
        os.environ.pop("TUIMON_RUNTIME_DIR", None)
    print(f"({time.monotonic() - started:.0f} s; one-off costs per run, with minus without: first, the "
          f"first {args.warmup} steps' time; start+end, Monitor start and close)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
