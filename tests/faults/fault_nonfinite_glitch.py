"""Fault: a one-off corrupted activation, as a flaky device or a race produces it.

A forward hook on the hidden layer writes a NaN into its output once, at the trigger, and never
again: the same batch computes cleanly on a re-run. The run asks for ``on_nonfinite="skip"``,
so the poisoned update is dropped and training goes on with finite weights. Expected:
``nonfinite_origin`` with ``reproduced: false`` (not the code: the node's health), and the loss
finite after it.
"""

from typing import Any

import torch
from _harness import Case, Run, backward, batches, main, mlp
from torch import nn

TRIGGER = 20


class OneOffGlitch:
    """Corrupts one activation once, when armed."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not self.armed:
            return None
        self.armed = False
        output = output.clone()
        output[0, 0] = float("nan")
        return output


def train(run: Run, policy: str = "skip") -> None:
    model = mlp((8, 32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    run.watch([optimizer], model, on_nonfinite=policy)
    glitch = OneOffGlitch()
    model[0].register_forward_hook(glitch)
    for step, batch in run.track_data(batches(30)):
        glitch.armed = step == TRIGGER
        optimizer.zero_grad()
        backward(model, batch)
        optimizer.step()


CASE = Case("fault_nonfinite_glitch", train, expect=("nonfinite_origin",), trigger=TRIGGER, within=0)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
