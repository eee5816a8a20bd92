"""Fault: dying ReLUs. The inputs are non-negative intensities (not centred, as raw pixels); at step
31 a warm-up bug applies 50x the learning rate for two steps. The large updates push the hidden
layers' pre-activations below zero for every input: their ReLUs output zeros for the whole batch,
get no gradient and never recover, while training goes on at the normal rate with a network that
can no longer learn. Expected: ``dead_activations`` naming the layers.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 30
BURST = 50.0


def train(run: Run) -> None:
    model = mlp((8, 64, 64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    burst = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: BURST if TRIGGER <= s < TRIGGER + 2 else 1.0)
    run.watch([optimizer], model)
    for _, (x, y) in batches(50):
        train_step(model, optimizer, (x.abs(), y))
        burst.step()


CASE = Case("fault_dead_relu", train, expect=("dead_activations",), trigger=TRIGGER, within=10)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
