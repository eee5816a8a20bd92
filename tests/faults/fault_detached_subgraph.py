"""Fault: a ``.detach()`` in the forward cuts one branch off from the gradient.

A two-branch model whose second branch output is detached before the sum (left over from a
debugging session): that branch's parameters never receive a gradient and never train.
Expected: ``missing_gradient`` naming ``branch_b``'s parameters.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step
from torch import nn


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch_a = mlp((8, 16, 1), seed=1)
        self.branch_b = mlp((8, 16, 1), seed=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch_a(x) + self.branch_b(x).detach()


def train(run: Run) -> None:
    model = TwoBranch()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for _, batch in batches(15):
        train_step(model, optimizer, batch)


CASE = Case("fault_detached_subgraph", train, expect=("missing_gradient",), trigger=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
