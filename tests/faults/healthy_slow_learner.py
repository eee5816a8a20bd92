"""Healthy: a slow learner. A 10-class classifier starts at chance, log(10) = 2.30, and with a small
learning rate (plain SGD at 0.01) learns slowly but surely: ~2.26 over its first 40 steps, then
down steadily to ~1.96 by step 300, clearly below chance. Close to chance early is not stuck at
chance: no ``chance_loss``, no ``loss_plateau`` (nor any other warning).
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 64, 10), seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch([optimizer], model)
    for _, batch in labelled(300, batch=64, seed=1):
        optimizer.zero_grad()
        classify(model, batch)
        optimizer.step()


CASE = Case("healthy_slow_learner", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
