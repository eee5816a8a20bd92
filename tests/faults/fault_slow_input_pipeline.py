"""Fault: slow input pipeline. From step 31 the records come from slow storage (a cache that stopped
holding the data set): each record takes 1 ms to read, 16 ms a batch, far longer than the training
step itself. The model trains exactly as before, only the accelerator waits. Expected:
``data_bottleneck``, from the time the loop waits in the DataLoader (``Monitor.track_data``).
"""

import time

import torch
from _harness import Case, Run, backward, main, mlp
from torch.utils.data import DataLoader, Dataset

TRIGGER = 30
BATCH = 16
READ_S = 0.001


class Records(Dataset):
    """A regression data set whose records past ``slow_from`` are slow to read."""

    def __init__(self, size: int, slow_from: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, 8, generator=g)
        self.y = torch.tanh(self.x.sum(dim=1, keepdim=True) / 3)
        self.slow_from = slow_from

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index >= self.slow_from:
            time.sleep(READ_S)
        return self.x[index], self.y[index]


def train(run: Run) -> None:
    model = mlp((8, 64, 64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model, manual=True)
    loader = DataLoader(Records(60 * BATCH, slow_from=TRIGGER * BATCH), batch_size=BATCH)
    for batch in run.track_data(loader):
        optimizer.zero_grad()
        loss = backward(model, batch)
        optimizer.step()
        run.step(loss, samples=BATCH)


CASE = Case("fault_slow_input_pipeline", train, expect=("data_bottleneck",), trigger=TRIGGER, within=15)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
