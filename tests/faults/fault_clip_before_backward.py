"""Fault: gradient clipping before the backward pass. The loop clears the gradients
(``zero_grad(set_to_none=True)``), calls ``clip_grad_norm_(model.parameters(), 1.0)``, and only then
``loss.backward()`` and ``optimizer.step()``: clipping finds no gradients (it returns 0) and every
step uses the unclipped ones, whose norm is 1.2-3.2 here (unnormalised inputs, a high learning
rate): the protection the run relies on is not there. Expected: ``clip_noop`` within 2 steps of
the start.
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    run.watch([optimizer], model)
    for _, batch in labelled(30, scale=4.0):
        optimizer.zero_grad(set_to_none=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the bug: nothing to clip yet
        classify(model, batch)
        optimizer.step()


CASE = Case("fault_clip_before_backward", train, expect=("clip_noop",), trigger=0, within=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
