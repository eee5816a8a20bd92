"""A plain PyTorch script with no tuimon code that stops stepping for a while inside one function.

    python plain_stalling_train.py STALL_S
"""

import sys
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)


def train_for(seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        batch = torch.randn(32, 16)
        loss = model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)


def wait_for_the_shared_disk(seconds: float) -> None:
    time.sleep(seconds)


train_for(1.0)
wait_for_the_shared_disk(float(sys.argv[1]))
train_for(2.5)
