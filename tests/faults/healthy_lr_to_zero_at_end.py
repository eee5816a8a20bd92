"""Healthy: schedules that bring the learning rate to 0 at their planned end, 400 steps each, and a
group kept at 0 on purpose. Three models trained side by side: cosine annealing to 0; linear
warm-up from 0 for 40 steps then linear decay to 0 at the last step (the Hugging Face default
schedule); a quadratic (polynomial, power 2) decay to 0 whose second param group (a frozen head)
has lr 0 throughout. Below 1e-4 of their peaks they spend their last 0.6 %, 0.01 % and 1 % of the
steps: no ``lr_vanished``, and nothing else.
"""

import math

import torch
from _harness import Case, Run, batches, main, mlp, train_step

STEPS = 400
WARMUP = 40


def train(run: Run) -> None:
    models = [mlp(seed=i) for i in range(3)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models[:2]]
    head = list(models[2].parameters())[-2:]
    body = list(models[2].parameters())[:-2]
    for p in head:
        p.requires_grad_(False)
    optimizers.append(torch.optim.SGD([{"params": body}, {"params": head, "lr": 0.0}], lr=0.05))
    schedules = [
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizers[0], T_max=STEPS, eta_min=0.0),
        torch.optim.lr_scheduler.LambdaLR(optimizers[1], lambda s: s / WARMUP if s < WARMUP
                                          else max(0.0, (STEPS - s) / (STEPS - WARMUP))),
        torch.optim.lr_scheduler.PolynomialLR(optimizers[2], total_iters=STEPS, power=2.0),
    ]
    for model, optimizer in zip(models, optimizers, strict=True):
        run.watch([optimizer], model)
    for _, batch in batches(STEPS):
        for model, optimizer, schedule in zip(models, optimizers, schedules, strict=True):
            train_step(model, optimizer, batch)
            schedule.step()
    assert math.isclose(schedules[0].get_last_lr()[0], 0.0, abs_tol=1e-12)


CASE = Case("healthy_lr_to_zero_at_end", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
