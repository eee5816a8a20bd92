"""A real, small PyTorch training on the CPU that walks through scripted incidents, for tuimon's demo.

    python -m publisher.demo [--run NAME] [--steps N] [--record PATH] [--endpoint ADDR]
                             [--step-delay S] [--seed N] [--fast]

The model (an MLP learning a fixed random linear teacher's labels, with some label noise) really trains:
its loss falls from about 2.3. A :class:`~publisher.monitor.Monitor` with a simulated node of four
GPUs publishes everything, and the script below makes the detectors fire on real signals: one
corrupted batch (loss spike), one batch holding a NaN (skipped, as a guarded trainer would), GPU 2
starved of input for 20 s, GPU 1 throttling for heat; then training goes on healthily and the
incidents come round again. Nothing is printed on stdout (the viewer owns the terminal); errors go
to stderr. SIGTERM and SIGINT end the run with ``run_end`` status ``interrupted`` and exit code 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

import torch
from torch import nn

from publisher.monitor import Monitor
from publisher.threads.gpu import SimulatedSource

INPUTS, HIDDEN, CLASSES = 32, 128, 10
BATCH = 64
LEARNING_RATE = 2e-3
LABEL_NOISE = 0.05
STARVED_GPU, HOT_GPU = 2, 1


@dataclass(frozen=True)
class Phase:
    """A stretch of the script: it lasts ``seconds`` (scaled by --fast) and at least ``min_steps``.

    ``min_steps`` leaves the loss detectors their warm-up and their quiet steps between incidents
    whatever the pace.
    """

    name: str
    seconds: float
    min_steps: int


SCRIPT = (
    Phase("warmup", 10, 60),
    Phase("loss_spike", 8, 40),
    Phase("nan_loss", 8, 40),
    Phase("gpu_starve", 20, 10),
    Phase("recover", 8, 20),
    Phase("gpu_throttle", 15, 10),
    Phase("healthy", 30, 40),
)
#: After the last phase the script starts again here (the warm-up is not repeated).
LOOP_FROM = 1
#: --fast compresses every duration by this factor and samples the GPUs this much faster.
FAST_SCALE = 0.05


class SyntheticTask:
    """Classification data labelled by a fixed random linear "teacher", with a little label noise.

    A linear teacher keeps the task learnable in a few hundred steps, so the loss visibly falls
    (about 2.3 to 0.6 in 250 steps, then slowly towards the noise floor).
    """

    def __init__(self, seed: int, size: int = 16_384) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        teacher = nn.Linear(INPUTS, CLASSES)
        for param in teacher.parameters():
            nn.init.normal_(param, std=1.0, generator=self.generator)
        self.inputs = torch.randn(size, INPUTS, generator=self.generator)
        with torch.no_grad():
            self.labels = teacher(self.inputs).argmax(dim=1)
        noisy = torch.rand(size, generator=self.generator) < LABEL_NOISE
        self.labels[noisy] = torch.randint(0, CLASSES, (int(noisy.sum()),), generator=self.generator)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(0, len(self.inputs), (BATCH,), generator=self.generator)
        return self.inputs[index], self.labels[index]


def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(INPUTS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
    )


class Script:
    """Walks :data:`SCRIPT`: says which phase a step is in and runs each phase's entry action."""

    def __init__(self, gpus: SimulatedSource, scale: float) -> None:
        self.gpus = gpus
        self.scale = scale
        self.index = 0
        self.started_at = time.monotonic()
        self.steps_in_phase = 0
        self.entry_actions: dict[str, Callable[[], None]] = {
            "gpu_starve": lambda: gpus.starve(STARVED_GPU, True),
            "recover": lambda: gpus.starve(STARVED_GPU, False),
            "gpu_throttle": lambda: gpus.throttle(HOT_GPU, "hw_thermal"),
            "healthy": lambda: gpus.throttle(HOT_GPU, None),
        }

    @property
    def phase(self) -> Phase:
        return SCRIPT[self.index]

    def advance(self) -> bool:
        """Move to the next phase when this one is over; True on the first step of a phase."""
        phase = self.phase
        over = time.monotonic() - self.started_at >= phase.seconds * self.scale
        if not (over and self.steps_in_phase >= phase.min_steps):
            self.steps_in_phase += 1
            return False
        self.index = self.index + 1 if self.index + 1 < len(SCRIPT) else LOOP_FROM
        self.started_at = time.monotonic()
        self.steps_in_phase = 1
        action = self.entry_actions.get(self.phase.name)
        if action:
            action()
        return True


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # a tiny model: leave the other cores to the viewer
    task = SyntheticTask(args.seed)
    model = build_model(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    config = {
        "model": f"MLP {INPUTS}-{HIDDEN}-{HIDDEN}-{CLASSES}",
        "optimizer": "Adam",
        "lr": LEARNING_RATE,
        "batch_size": BATCH,
        "label_noise": LABEL_NOISE,
        "demo": True,
        "gpus": "4 simulated (not real hardware)",
    }
    scale = FAST_SCALE if args.fast else 1.0
    with Monitor(
        model,
        optimizer,
        run=args.run,
        rank=0,
        world_size=1,
        config=config,
        seed=args.seed,
        endpoint=args.endpoint,
        record=args.record,
        gpu="simulated",
        gpu_interval=1.0 * scale,
    ) as mon:
        assert isinstance(mon.gpu_source, SimulatedSource)
        script = Script(mon.gpu_source, scale)
        step = 0
        while args.steps == 0 or step < args.steps:
            started = time.perf_counter()
            first_of_phase = script.advance()
            inputs, labels = task.batch()
            if first_of_phase and script.phase.name == "loss_spike":
                inputs = inputs * 10.0  # a corrupted batch: wrong scaling and shuffled labels
                labels = labels[torch.randperm(BATCH, generator=task.generator)]
            elif first_of_phase and script.phase.name == "nan_loss":
                inputs = inputs.clone()
                inputs[0, 0] = float("nan")  # one bad value in the batch poisons the loss
            data_time = time.perf_counter() - started
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            if torch.isfinite(loss):
                optimizer.step()
            # else: skip the update, as a guarded trainer does; the next zero_grad clears the NaNs
            mon.step(loss, samples=BATCH, data_time=data_time)
            step += 1
            pause = args.step_delay - (time.perf_counter() - started)
            if pause > 0:
                time.sleep(pause)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second signal must not break the clean shutdown
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m publisher.demo",
        description="Real CPU training with scripted incidents and 4 SIMULATED GPUs, published for tuimon.",
    )
    parser.add_argument("--run", default="demo", help="run name (default: demo)")
    parser.add_argument("--steps", type=int, default=0, help="steps to train; 0: until stopped (default)")
    parser.add_argument("--record", metavar="PATH", help="also write every message to this JSON Lines file")
    parser.add_argument("--endpoint", metavar="ADDR", help="PUB address (default tcp://127.0.0.1:<random>)")
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.06,
        metavar="S",
        help="minimum seconds per step, to pace the run for human eyes (default 0.06: ~15 steps/s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for data, model and batches (default 0)")
    parser.add_argument(
        "--fast",
        action="store_true",
        help=f"compress the incident script {1 / FAST_SCALE:.0f}x and sample GPUs as much faster (tests)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 0 or args.step_delay < 0:
        print("python -m publisher.demo: --steps and --step-delay must not be negative", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        train(args)
    except KeyboardInterrupt:
        pass  # the Monitor already sent run_end "interrupted"
    except Exception as exc:  # e.g. an --endpoint that cannot be bound: one clear line, no traceback
        print(f"python -m publisher.demo: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
