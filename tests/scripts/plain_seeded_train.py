"""A plain PyTorch training script with no tuimon code in it, whose learning rate and seed are
options: two runs of it that differ in one setting are what `tuimon diff` compares.

The task (inputs and targets) is the same whatever the seed; the seed draws the initial weights and
the order of the batches, as it does in most training scripts.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--lr", type=float, default=0.02)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep after each step")
args = parser.parse_args()

task = torch.Generator().manual_seed(1234)
inputs = torch.randn(4096, 16, generator=task)
targets = torch.tanh(inputs @ torch.randn(16, 1, generator=task)) + 0.1 * torch.randn(4096, 1, generator=task)

torch.manual_seed(args.seed)
loader = DataLoader(TensorDataset(inputs, targets), batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

step = 0
while step < args.steps:
    for batch, target in loader:
        loss = torch.nn.functional.mse_loss(model(batch), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        time.sleep(args.step_delay)
        if step >= args.steps:
            break
