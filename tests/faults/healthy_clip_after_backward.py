"""Healthy: gradient clipping where it belongs, in two training loops (each its own model and
Monitor). The textbook order, backward, ``clip_grad_norm_(..., 1.0)``, step, on gradients whose
norm is 1.2-2.3 (unnormalised inputs): clipping bites on every step. And gradient accumulation
over 4 micro-batches, clipping by value (0.05, which clamps 0.3-3 % of the entries) once per
optimizer step, after the last micro-batch's backward (not after each one, never on cleared
gradients). No ``clip_noop`` (nor any other warning).
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp

MICRO = 4
STEPS = 30


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    run.watch([optimizer], model)
    for _, batch in labelled(STEPS, scale=4.0):
        optimizer.zero_grad()
        classify(model, batch)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    accumulating = mlp((16, 64, 64, 10), seed=1)
    optimizer = torch.optim.SGD(accumulating.parameters(), lr=0.2)
    run.watch([optimizer], accumulating)
    for step, batch in labelled(STEPS * MICRO, scale=4.0, seed=1):
        classify(accumulating, batch, scale=1 / MICRO)
        if step % MICRO == MICRO - 1:
            torch.nn.utils.clip_grad_value_(accumulating.parameters(), 0.05)
            optimizer.step()
            optimizer.zero_grad()


CASE = Case("healthy_clip_after_backward", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
