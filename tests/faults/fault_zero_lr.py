"""Fault: the optimizer's param group gets lr 0 (an lr=0 param group: ``step()`` changes nothing).

The linear scaling rule written with floor division, ``base_lr * batch // 256`` with batch 32,
gives exactly 0.0; every step is a no-op from the first one. Expected: ``optimizer_noop``.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

BASE_LR, BATCH = 0.1, 32


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * BATCH // 256)
    run.watch([optimizer], model)
    for _, batch in batches(15, batch=BATCH):
        train_step(model, optimizer, batch)


CASE = Case("fault_zero_lr", train, expect=("optimizer_noop",), trigger=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
