"""A plain PyTorch script with no tuimon code whose data fetch blocks on a lock for a while.

    python plain_blocked_fetch.py STALL_S

Another thread holds the lock the fetch needs (a shared disk, a cache being refilled) for STALL_S
seconds; the script prints ``BLOCK <unix time>`` as the fetch starts waiting for it.
"""

import sys
import threading
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
shared_disk = threading.Lock()


def fetch_batch() -> torch.Tensor:
    with shared_disk:
        return torch.randn(32, 16)


def hold_the_disk(seconds: float) -> None:
    with shared_disk:
        time.sleep(seconds)


def train_for(seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        loss = model(fetch_batch()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)


train_for(1.5)
holder = threading.Thread(target=hold_the_disk, args=(float(sys.argv[1]),))
holder.start()
time.sleep(0.05)
print(f"BLOCK {time.time()}", flush=True)
train_for(0.0)  # one step, whose fetch waits for the lock
train_for(2.0)
holder.join()
