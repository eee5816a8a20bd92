"""Healthy: gradient accumulation over k=4 micro-batches (zero_grad and step every 4 backwards)."""

import torch
from _harness import Case, Run, backward, batches, main, mlp

K = 4


def train(run: Run) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run.watch([optimizer], model)
    for micro, batch in batches(30 * K, batch=8):
        backward(model, batch, scale=1 / K)
        if micro % K == K - 1:
            optimizer.step()
            optimizer.zero_grad()


CASE = Case("healthy_accumulation", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
