"""What tuimon costs a small GPT trained the way nanoGPT trains, at torch's default thread count.

    python benchmarks/small_gpt.py [--pairs N] [--iters N] [--threads default,1] [--arms plain,run,embedded]

Each arm is a whole training process, as a user runs it: ``plain`` (the script alone), ``run``
(the same script under ``tuimon run``, no code change) and ``embedded`` (the script with a
``Monitor(model, optimizer)`` and ``mon.step(loss)`` in its loop). The arms run one after another,
their order reversed every pair (ABBA), so that a shared machine's drift hits them alike.

The model is written here from scratch after the shape of karpathy/nanoGPT's character-level
Shakespeare run on a CPU (its README's settings: 4 layers, 4 heads, 128 wide, 64 tokens of
context, 12 sequences a batch, no dropout): many small operations a step, AdamW over two
parameter groups (decayed matrices, undecayed vectors), gradient clipping, a cosine learning rate
with warm-up, batches cut from a token array with ``torch.randint`` + ``torch.stack``. Torch runs
at its default intra-op thread count, then at one (``--threads``): at one thread a second OpenMP
pool made by one of tuimon's threads (the cause of the 1.3-1.9x slowdown measured on nanoGPT
itself: ``docs/benchmarks.md``) costs nothing, and the other benchmarks pinned one thread. Each
arm is a process of its own because such a pool, once made, slows every later step of its process,
a plain loop's too.

Printed per arm: the mean milliseconds an iteration from iteration :data:`SKIP` on (each
iteration timed with ``time.time()`` around the whole loop body, as nanoGPT's ``dt``), the
training thread's CPU milliseconds an iteration and the share of its wall time it spent off a CPU
(``/proc/thread-self/stat``: waits for the GIL, for torch's pool threads woken from sleep, for
I/O), and each monitored arm's ratio to ``plain`` in every pair and their median.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blocks import add_threads_option, chosen, thread_counts  # noqa: E402

#: Iterations left out of the means: start-up, the first allocations, the Monitor's first looks.
SKIP = 20
ARMS = ("plain", "run", "embedded")
#: nanoGPT's CPU settings (its README: "baby GPT" on a MacBook), and its AdamW's.
LAYERS, HEADS, WIDTH, CONTEXT, BATCH, VOCAB = 4, 4, 128, 64, 12, 65
LEARNING_RATE, WARMUP, MIN_LR, BETAS, WEIGHT_DECAY, CLIP = 1e-3, 10, 1e-4, (0.9, 0.99), 0.1, 1.0


@dataclass(frozen=True)
class ArmResult:
    """One training process's figures (see the module's docstring)."""

    ms: float
    cpu_ms: float
    off_cpu: float


def train(iters: int, embedded: bool) -> list[tuple[float, float, float]]:
    """Train the small GPT for ``iters`` iterations; each iteration's (wall, training thread's CPU)
    seconds and the wall clock at its end."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.attn, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.attn(self.ln_1(x)).split(WIDTH, dim=2)
            q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln_2(x))))

    class SmallGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
            self.head.weight = self.tokens.weight  # tied, as GPT-2's

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    torch.manual_seed(0)
    # A learnable stream: each token mostly follows from the one before (a random successor table).
    successor = torch.randint(VOCAB, (VOCAB,))
    data = torch.empty(200_000, dtype=torch.long)
    data[0] = 0
    noise = torch.randint(VOCAB, (len(data),))
    keep = torch.rand(len(data)) < 0.8
    for i in range(1, len(data)):
        data[i] = successor[data[i - 1]] if keep[i] else noise[i]
    model = SmallGPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LEARNING_RATE, betas=BETAS)
    monitor = None
    if embedded:
        from publisher import Monitor
        monitor = Monitor(model, optimizer, run="small-gpt", gpu="none")

    def lr_at(it: int) -> float:
        if it < WARMUP:
            return LEARNING_RATE * (it + 1) / (WARMUP + 1)
        ratio = (it - WARMUP) / max(1, iters - WARMUP)
        return MIN_LR + 0.5 * (1 + math.cos(math.pi * ratio)) * (LEARNING_RATE - MIN_LR)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(data) - CONTEXT - 1, (BATCH,))
        x = torch.stack([data[i:i + CONTEXT] for i in starts])
        y = torch.stack([data[i + 1:i + 1 + CONTEXT] for i in starts])
        return x, y

    times = []
    x, y = batch()
    for it in range(iters):
        t0, c0 = time.time(), time.thread_time()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it)
        loss = model(x, y)
        x, y = batch()  # the next batch while the graph waits, as nanoGPT fetches it
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        if monitor is not None:
            monitor.step(loss)
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # nanoGPT reads the loss at its log interval; here every iteration
        times.append((time.time() - t0, time.thread_time() - c0, time.time()))
    if monitor is not None:
        monitor.close()
    return times


def child(iters: int, embedded: bool) -> None:
    """One arm's process: train, then print its figures as one line (``ms cpu_ms off_cpu``)."""
    times = train(iters, embedded)[SKIP:]
    wall = sum(t[0] for t in times)
    cpu = sum(t[1] for t in times)
    print(f"RESULT {1e3 * wall / len(times):.3f} {1e3 * cpu / len(times):.3f} {max(0.0, 1 - cpu / wall):.4f}")


def run_arm(arm: str, iters: int, threads: int) -> ArmResult:
    """One arm in a process of its own; its figures."""
    program = "embedded" if arm == "embedded" else "plain"
    script = [sys.executable, str(Path(__file__).resolve()), "--child", program, "--iters", str(iters)]
    tuimon_run = [sys.executable, "-m", "tuimon.cli", "run", "--gpu", "none", "--"]
    command = [*tuimon_run, *script] if arm == "run" else script
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"small_gpt.py: the {arm} arm failed: {tail}")
    ms, cpu_ms, off_cpu = (float(v) for v in lines[-1].split()[1:])
    return ArmResult(ms, cpu_ms, off_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="ABBA rounds over the arms (default 3)")
    parser.add_argument("--iters", type=int, default=150, help="iterations a run (default 150)")
    add_threads_option(parser)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"which arms (default {','.join(ARMS)})")
    parser.add_argument("--child", choices=("plain", "embedded"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.iters, args.child == "embedded")
        return
    if args.iters <= SKIP:
        parser.error(f"--iters must be above {SKIP}, the iterations left out")
    arms = chosen(parser, "--arms", args.arms, ARMS)
    if "plain" not in arms:
        arms.insert(0, "plain")
    for threads in thread_counts(parser, args.threads):
        compare(arms, args.pairs, args.iters, threads)


def compare(arms: list[str], pairs: int, iters: int, threads: int) -> None:
    """``pairs`` ABBA rounds of ``arms`` at ``threads`` torch threads: a line a run, then the table."""
    results: dict[str, list[ArmResult]] = {arm: [] for arm in arms}
    print(f"small GPT ({LAYERS} layers, {WIDTH} wide, batch {BATCH}x{CONTEXT}), {iters} iterations a "
          f"run, {threads} torch thread(s), {pairs} pairs")
    for pair in range(pairs):
        for arm in arms if pair % 2 == 0 else arms[::-1]:
            result = run_arm(arm, iters, threads)
            results[arm].append(result)
            print(f"  pair {pair + 1} {arm:>8}: {result.ms:7.2f} ms/iter, training thread "
                  f"{result.cpu_ms:6.2f} ms CPU, {100 * result.off_cpu:4.1f} % off CPU", flush=True)
    print(f"{'arm':>10} {'ms/iter':>9} {'CPU ms':>8} {'off CPU':>8}  ratio to plain (each pair; median)")
    for arm in arms:
        rows = results[arm]
        ratios = [r.ms / p.ms for r, p in zip(rows, results["plain"], strict=True)]
        shown = "" if arm == "plain" else (" ".join(f"{r:.3f}" for r in ratios)
                                           + f"; {statistics.median(ratios):.3f}")
        ms, cpu_ms = statistics.median(r.ms for r in rows), statistics.median(r.cpu_ms for r in rows)
        off_cpu = statistics.median(r.off_cpu for r in rows)
        print(f"{arm:>10} {ms:9.2f} {cpu_ms:8.2f} {100 * off_cpu:7.1f}%  {shown}")


if __name__ == "__main__":
    main()
