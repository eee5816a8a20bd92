"""Healthy: a longer classification run with everything that must not look like a fault to the
detectors: small noisy batches (8), a learning-rate warm-up from 0, a planned 10x drop, an
evaluation pass every 100 steps (model.eval(), no_grad, a pause in the step times), a DataLoader
timed by ``track_data``, memory read every step, and a loss that keeps falling then flattens.
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp
from torch.utils.data import DataLoader, TensorDataset

STEPS, BATCH, WARMUP, DROP_AT, EVAL_EVERY = 360, 8, 40, 250, 100


def schedule(step: int) -> float:
    return min(1.0, step / WARMUP) * (0.1 if step >= DROP_AT else 1.0)


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    lr = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    run.watch([optimizer], model, manual=True)
    pairs = [batch for _, batch in labelled(STEPS, batch=BATCH)]
    data = TensorDataset(torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs]))
    held_out = [batch for _, batch in labelled(30, batch=64, seed=9)]
    for step, batch in enumerate(run.track_data(DataLoader(data, batch_size=BATCH)), start=1):
        optimizer.zero_grad()
        loss = classify(model, batch)
        optimizer.step()
        lr.step()
        run.step(loss, samples=BATCH)
        if step % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                for x, _ in held_out:
                    model(x)
            model.train()


CASE = Case("healthy_long_training", train)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
