"""Fault: exploding gradients. From step 41 the inputs reach the model without their normalisation
(a preprocessing step dropped: features 20x larger). Plain SGD at a learning rate that was stable
now overshoots further at every step, and the gradient norm grows geometrically. Expected:
``grad_explosion`` once the norm has stayed far above its level for a few steps.
"""

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 40
SCALE = 20.0


def train(run: Run) -> None:
    model = mlp((8, 32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for step, (x, y) in batches(60):
        train_step(model, optimizer, (x * SCALE if step >= TRIGGER else x, y))


CASE = Case("fault_exploding_gradients", train, expect=("grad_explosion",), trigger=TRIGGER, within=5)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
