"""Healthy: a momentum (EMA) target network inside the model, frozen (requires_grad=False) and in
the optimizer's parameter list (as in MoCo), moved by the EMA after each step, never by step()."""

import torch
from _harness import Case, Run, batches, main, mlp
from torch import nn

MOMENTUM = 0.9


def train(run: Run) -> None:
    model = nn.ModuleDict({"online": mlp(seed=1), "target": mlp(seed=1)})
    model.target.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    run.watch([optimizer], model)
    for _, (x, y) in batches(30):
        optimizer.zero_grad()
        prediction = model.online(x)
        with torch.no_grad():
            anchor = model.target(x)
        nn.functional.mse_loss(prediction, 0.5 * (y + anchor)).backward()
        optimizer.step()
        with torch.no_grad():
            for online, target in zip(model.online.parameters(), model.target.parameters(), strict=True):
                target.mul_(MOMENTUM).add_(online, alpha=1 - MOMENTUM)


CASE = Case("healthy_ema_target", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
