"""Fault: hidden layers kept in a plain Python list. ``self.blocks = [nn.Linear(64, 64) for _ in
range(3)]`` instead of ``nn.ModuleList``: the layers run in ``forward`` and receive gradients every
step, but ``model.parameters()`` never lists them, so the optimizer built from it steps only the
input and output layers, and nothing clears the blocks' ``.grad``. The loss still falls (the outer
layers learn around three random layers). Neither the model nor the optimizer knows the blocks:
only the loss's autograd graph reaches them. Expected: ``unowned_tensors`` (a warning), at the
first ownership check (step 5), naming six tensors of shapes 64x64 and 64.
"""

import torch
from _harness import Case, Run, labelled, main
from torch import nn
from torch.nn import functional


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.blocks = [nn.Linear(64, 64) for _ in range(3)]  # the bug: not an nn.ModuleList
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for block in self.blocks:
            h = torch.relu(block(h)) + h
        return self.out(h)


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model, manual=True)
    for _, (x, y) in labelled(30, batch=64, seed=1):
        optimizer.zero_grad()
        loss = functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        run.step(loss)


CASE = Case("fault_unregistered_layers", train, expect=("unowned_tensors",), trigger=0, within=6)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
