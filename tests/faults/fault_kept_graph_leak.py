"""Fault: a held-out metric that keeps its graph. From loop index 100 each step also scores a
held-out batch for a metric averaged later, ``held_out.append(loss_fn(model(x), y))``, without
``torch.no_grad()`` and without ``.item()``: no backward ever frees those graphs, so every step
keeps its held-out activations alive, about 3.5 MiB of host memory a step (a held-out batch of 1280
rows: with 640, ~1.5-2 MiB a step, the leak reached the detector's threshold, a quarter of its 1 GiB
budget, so late in the run that a slow-growing run once ended before it). Expected:
``memory_growth`` within max(10 steps, 1 s), or before
the process grew by 1 GiB or a tenth of the available memory.
"""

import torch
from _harness import Case, Run, batches, main, mlp, paced, release_free_memory, train_step
from torch import nn

TRIGGER = 100
STEP_S = 0.015


def train(run: Run) -> None:
    release_free_memory()
    model = mlp((32, 256, 256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch([optimizer], model)
    held_out: list[torch.Tensor] = []
    scored = batches(TRIGGER + 200, batch=1280, dim=32, seed=1)
    for step, batch in paced(batches(TRIGGER + 200, batch=64, dim=32), STEP_S):
        train_step(model, optimizer, batch)
        _, (x, y) = next(scored)
        if step >= TRIGGER:
            held_out.append(nn.functional.mse_loss(model(x), y))  # the bug: the graph stays alive


CASE = Case("fault_kept_graph_leak", train, expect=("memory_growth",), trigger=TRIGGER, within=10,
            within_s=1.0, step_s=STEP_S, own_process=True, leak=True)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
