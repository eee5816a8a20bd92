"""A healthy CPU training with the pauses real runs have, watched by a Monitor with its defaults:

- a slow first step (6 s of autotuning between step 1 and step 2, as compilation takes);
- a busy 8 s validation pass every 40 steps, twice;
- a sharded checkpoint written with ``torch.save``, 256 MiB shards until 4 s have passed (a fast
  disk or a tmpfs writes 1.5 GiB in under the 2.5 s the test counts as a pause);
- a new epoch whose DataLoader workers take 7 s to start (each opens its shards), the training
  thread waiting for them.

    python monitored_healthy_pauses.py RECORDING WORK_DIR

None of them is a fault: the recording must hold no warning.
"""

import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from publisher.monitor import Monitor

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
mon = Monitor(model, optimizer, run="pauses", gpu="none", record=sys.argv[1])
work = Path(sys.argv[2])


def autotune(seconds: float) -> None:
    """Busy as an autotuner is: candidate kernels timed one after the other."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for size in (64, 128, 256):
            started = time.perf_counter()
            torch.mm(torch.randn(size, size), torch.randn(size, size))
            time.perf_counter() - started


def validate(seconds: float) -> None:
    model.eval()
    until = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < until:
            model(torch.randn(256, 32)).sum().item()
    model.train()


def save_checkpoint() -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, work / "checkpoint.pt")
    until = time.monotonic() + 4.0
    shard = 0
    while time.monotonic() < until:
        torch.save([torch.ones(1024, 1024) for _ in range(64)], work / f"ema.{shard}.pt")  # 256 MiB
        shard += 1
    for path in work.glob("*.pt"):
        path.unlink()


def open_the_shards(worker_id: int) -> None:
    """A DataLoader worker's start: busy reading its shards' indexes for 7 s."""
    until = time.monotonic() + 7.0
    while time.monotonic() < until:
        sum(range(10_000))


def next_epoch() -> DataLoader:
    data = TensorDataset(torch.randn(1024, 32))
    return DataLoader(data, batch_size=64, num_workers=2, worker_init_fn=open_the_shards)


batches = None
for step in range(1, 141):
    inputs = torch.randn(64, 32)
    if step == 100:
        batches = iter(next_epoch())
    if batches is not None:
        inputs = next(batches, (inputs,))[0]
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    mon.step(loss)
    time.sleep(0.01)
    if step == 1:
        autotune(6.0)
    if step in (40, 80):
        validate(8.0)
    if step == 120:
        save_checkpoint()
mon.close()
