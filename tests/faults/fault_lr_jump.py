"""Fault: the learning rate jumps 100x at step 41 (a scheduler whose multiplier is applied twice, or
a restart to the wrong peak). Adam keeps each update near ``lr`` whatever the gradient, so the loss
may not even spike at once: the weights simply move 100x faster than they did. Expected:
``update_ratio`` (|dw|/|w| of the weights far above its own recent level) at the next sample.
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp

TRIGGER = 40


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    jump = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 100.0 if s >= TRIGGER else 1.0)
    run.watch([optimizer], model)
    for _, batch in labelled(70):
        optimizer.zero_grad()
        classify(model, batch)
        optimizer.step()
        jump.step()


CASE = Case("fault_lr_jump", train, expect=("update_ratio",), trigger=TRIGGER, within=10)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
