"""Fault: gradient clipping by value after the gradients were cleared. The loop runs backward and
``optimizer.step()``, then ``zero_grad(set_to_none=False)``, and clips last, with
``clip_grad_value_(model.parameters(), 0.05)``: it clamps the zero tensors zero_grad left, never a
real gradient, though hundreds of entries here exceed 0.05 (unnormalised inputs, a high learning rate).
Expected: ``clip_noop`` within 2 steps of the start.
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    run.watch([optimizer], model)
    for _, batch in labelled(30, scale=4.0):
        classify(model, batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)  # the bug: clamps the zeros


CASE = Case("fault_clip_after_zero_grad", train, expect=("clip_noop",), trigger=0, within=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
