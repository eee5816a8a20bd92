"""Healthy: LBFGS with a closure (zero_grad + backward inside ``step()``), run until it converges
and beyond: converged steps that move nothing must not count as no-ops."""

import torch
from _harness import Case, Run, backward, batches, main, mlp


def train(run: Run) -> None:
    model = mlp((8, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=5)
    run.watch([optimizer], model)
    _, batch = next(batches(1, batch=64))
    for _ in range(20):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            return backward(model, batch)

        optimizer.step(closure)


CASE = Case("healthy_lbfgs", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
