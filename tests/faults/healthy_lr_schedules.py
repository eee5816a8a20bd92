"""Healthy: learning-rate schedules that touch or approach 0 on purpose: linear warm-up from 0,
step decay x0.1 every 8 steps, and a cosine schedule that ends at exactly 0 on the last step
(three models trained side by side, one optimizer each)."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

STEPS = 30


def train(run: Run) -> None:
    models = [mlp(seed=i) for i in range(3)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    schedules = [
        torch.optim.lr_scheduler.LambdaLR(optimizers[0], lambda s: min(1.0, s / 5)),
        torch.optim.lr_scheduler.StepLR(optimizers[1], step_size=8, gamma=0.1),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizers[2], T_max=STEPS - 1, eta_min=0.0),
    ]
    for model, optimizer in zip(models, optimizers, strict=True):
        run.watch([optimizer], model)
    for _, batch in batches(STEPS):
        for model, optimizer, schedule in zip(models, optimizers, schedules, strict=True):
            train_step(model, optimizer, batch)
            schedule.step()


CASE = Case("healthy_lr_schedules", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
