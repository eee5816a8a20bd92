"""A classifier whose loss is taken over its labelled rows only, with no tuimon code in it: on a batch
with no labelled row the selection is empty and the loss is NaN (a mean over nothing). Prints the
steps whose loss was NaN as ``nan steps: 3,17,...``."""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--batch", type=int, default=6)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
rows = args.steps * args.batch
inputs, labels = torch.randn(rows, 8), torch.randint(0, 4, (rows,))
labelled = torch.rand(rows) < 0.5  # half the rows carry no label
nan_steps = []
for step in range(1, args.steps + 1):
    batch = slice((step - 1) * args.batch, step * args.batch)
    mask = labelled[batch]
    logits = model(inputs[batch])
    loss = F.cross_entropy(logits[mask], labels[batch][mask])
    if torch.isnan(loss):
        nan_steps.append(step)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("nan steps:", ",".join(map(str, nan_steps)), flush=True)
