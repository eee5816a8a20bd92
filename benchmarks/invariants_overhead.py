"""Step time with and without the invariant checker, at a ~1 ms and a >= 20 ms CPU training step.

Blocks of steps with and without the checker alternate (the same model and optimizer), so load
from other processes hits both alike; the ratio of medians is printed per model size, with the
checker's own time per step measured inside its hooks (``InvariantChecker.overhead()``), which
stays readable when the machine is too busy for the ratio to resolve 1 %. Times are CPU time of
this process (one torch thread). The checker is attached before a warm-up, so the numbers are its
steady state (sampled checks every ``check_every`` steps), not its first, denser steps.

    /work/main/.venv/bin/python benchmarks/invariants_overhead.py [--trials 15] [--steps 200]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from blocks import add_threads_option, thread_counts
from torch import nn

from publisher.invariants import InvariantChecker

SIZES = {
    # name: (layer widths, batch size)
    "small (~1 ms step)": ((64, 256, 256, 10), 32),
    "large (>=20 ms step)": ((256, 1280, 1280, 10), 128),
}


def build(widths: tuple[int, ...]) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers += [nn.ReLU(), nn.Dropout(0.1)]
    return nn.Sequential(*layers)


def run_block(model: nn.Module, optimizer: torch.optim.Optimizer, data: list, steps: int) -> float:
    """Seconds per step over ``steps`` textbook training steps."""
    loss_fn = nn.CrossEntropyLoss()
    start = time.process_time()
    for i in range(steps):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return (time.process_time() - start) / steps


def measure(widths: tuple[int, ...], batch: int, trials: int, steps: int
            ) -> tuple[float, float, float, float]:
    """Median step time without and with the checker, their ratio, and the checker's own time per
    step (its hooks, timed from inside: a stable figure on a busy machine where ratios are noisy)."""
    model = build(widths)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(batch, widths[0], generator=g), torch.randint(0, widths[-1], (batch,), generator=g))
            for _ in range(8)]
    events: list = []
    run_block(model, optimizer, data, 20)  # warm-up: allocator, kernels
    off, on, own = [], [], []
    for _ in range(trials):
        off.append(run_block(model, optimizer, data, steps))
        checker = InvariantChecker([optimizer], model, emit_violation=lambda *a: events.append(a),
                                   emit_status=lambda *a: events.append(a))
        run_block(model, optimizer, data, 10)  # past the dense first steps
        before = checker.overhead()["seconds"]
        on.append(run_block(model, optimizer, data, steps))
        own.append((checker.overhead()["seconds"] - before) / steps)
        checker.close()
    base, watched = statistics.median(off), statistics.median(on)
    return base, watched, watched / base, statistics.median(own)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=15, help="alternating blocks per variant")
    parser.add_argument("--steps", type=int, default=0, help="steps per block (default: ~0.5 s worth)")
    add_threads_option(parser)
    args = parser.parse_args()
    counts = thread_counts(parser, args.threads)
    for threads, (name, (widths, batch)) in itertools.product(counts, SIZES.items()):
        torch.set_num_threads(threads)
        if name == next(iter(SIZES)):
            print(f"torch {torch.__version__}, {threads} thread(s), {args.trials} alternating trials")
        steps = args.steps
        if not steps:
            probe = build(widths)
            one = run_block(probe, torch.optim.AdamW(probe.parameters()),
                            [(torch.randn(batch, widths[0]), torch.randint(0, widths[-1], (batch,)))], 5)
            steps = max(10, int(0.5 / one))
        base, watched, ratio, own = measure(widths, batch, args.trials, steps)
        print(f"{name:<22} {steps:>4} steps/block  without {base * 1e3:8.3f} ms  with {watched * 1e3:8.3f} ms"
              f"  ratio {ratio:.4f}  checker's own time {own * 1e6:6.1f} us/step = {own / base:.2%}")


if __name__ == "__main__":
    main()
