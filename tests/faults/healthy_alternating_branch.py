"""Healthy: a branch used only on every other step (odd steps), and a layer unfrozen at step 12
(its own gradient window starts then): neither is a missing gradient."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step
from torch import nn

UNFREEZE = 12


class Alternating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = mlp((8, 16, 1), seed=1)
        self.extra = mlp((8, 16, 1), seed=2)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return self.trunk(x) + (self.extra(x) if self.step % 2 == 0 else 0)


def train(run: Run) -> None:
    model = Alternating()
    late = nn.Linear(1, 1)
    late.requires_grad_(False)
    optimizer = torch.optim.Adam([*model.parameters(), *late.parameters()], lr=1e-3)
    run.watch([optimizer], nn.ModuleDict({"model": model, "late": late}))
    for step, batch in batches(30):
        if step == UNFREEZE:
            late.requires_grad_(True)
        train_step(lambda x: late(model(x)), optimizer, batch)


CASE = Case("healthy_alternating_branch", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
