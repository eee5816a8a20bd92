"""A plain PyTorch training script with no tuimon code in it: what `tuimon run` must monitor."""

import argparse
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--nan-at", type=int, default=-1, help="make the loss NaN at this step")
parser.add_argument("--raise-at", type=int, default=-1, help="raise an exception after this step")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep after each step")
parser.add_argument("--subclass", action="store_true", help="an SGD subclass whose step() calls super()")
args = parser.parse_args()


class LoggingSGD(torch.optim.SGD):
    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


torch.manual_seed(0)
inputs = torch.randn(2048, 16)
targets = inputs @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
loader = DataLoader(TensorDataset(inputs, targets), batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
if args.subclass:  # the base class was instantiated too: torch then runs step hooks per level
    optimizer = LoggingSGD(model.parameters(), lr=0.05)

step = 0
while step < args.steps:
    for batch, target in loader:
        loss = torch.nn.functional.mse_loss(model(batch), target)
        if step + 1 == args.nan_at:
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        time.sleep(args.step_delay)
        if step == args.raise_at:
            raise RuntimeError("boom")
        if step >= args.steps:
            break
sys.exit(args.exit_code)
