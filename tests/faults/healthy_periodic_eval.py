"""Healthy: evaluation passes every few steps with eval()/train() around them (one under no_grad(),
one that forgot it); the model has Dropout and BatchNorm."""

import torch
from _harness import Case, Run, batches, main, mlp, train_step


def train(run: Run) -> None:
    model = mlp((8, 32, 32, 1), dropout=0.2, batch_norm=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for step, batch in batches(40):
        if step % 6 == 5:
            model.eval()
            with torch.no_grad():
                model(batch[0])
            model.train()
        if step % 6 == 2:  # an evaluation that forgot no_grad(): grad-enabled, but no step follows it
            model.eval()
            model(batch[0])
            model.train()
        train_step(model, optimizer, batch)


CASE = Case("healthy_periodic_eval", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
