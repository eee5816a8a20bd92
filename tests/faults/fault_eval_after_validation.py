"""Fault: a validation pass that leaves the model in eval mode. At loop index 40 the loop validates
(``model.eval()``, a few batches under ``torch.no_grad()``) and never calls ``model.train()``: from
then on the model trains with dropout off and batch norm frozen on its running statistics. Steps of
~10 ms. Expected: ``eval_mode_training`` within max(2 steps, 1 s) of the first step in eval mode.
"""

import torch
from _harness import Case, Run, batches, main, mlp, paced, train_step
from torch import nn

TRIGGER = 40
STEP_S = 0.01


def validate(model: nn.Module, held_out: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The bug: eval() with no train() after it."""
    model.eval()
    with torch.no_grad():
        return sum(nn.functional.mse_loss(model(x), y).item() for x, y in held_out) / len(held_out)


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1), dropout=0.2, batch_norm=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    held_out = [batch for _, batch in batches(3, seed=9)]
    for step, batch in paced(batches(TRIGGER + 40), STEP_S):
        if step == TRIGGER:
            validate(model, held_out)
        train_step(model, optimizer, batch)


CASE = Case("fault_eval_after_validation", train, expect=("eval_mode_training",), trigger=TRIGGER,
            within=2, within_s=1.0, step_s=STEP_S)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
