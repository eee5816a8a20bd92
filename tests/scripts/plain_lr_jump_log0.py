"""Two real bugs, no tuimon code: a hand-written step decay that multiplies the learning rate by 100
at step 150 where it meant to divide, and a loss written as ``-log(softmax(logits))`` (not
``cross_entropy``), which reaches ``log(0) = -inf`` once the logits blow up. Trains ``--steps``
steps of a small MLP classifier and exits 0 whatever happened, as such scripts do."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
inputs, labels = torch.randn(4096, 16), torch.randint(0, 4, (4096,))
for step in range(1, args.steps + 1):
    if step == 150:
        for group in optimizer.param_groups:
            group["lr"] *= 100  # meant: /= 100
    rows = torch.randint(0, 4096, (32,))
    probs = torch.softmax(model(inputs[rows]), dim=1)
    loss = -torch.log(probs[torch.arange(32), labels[rows]]).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done", flush=True)
