"""Fault (2 gloo processes): the attention's 0/0 of ``fault_nonfinite_forward`` on both ranks.

Both ranks get a batch of length-1 sequences at the trigger (a length-bucketing sampler hands
every rank the same bucket). DDP all-reduces the NaN gradients; each rank re-runs its own step on
the module inside DDP (no collective runs in the re-run). Expected: ``nonfinite_origin`` naming
``Net.attn``, forward, reproduced, on each rank.
"""

import torch
from _harness import Case, Run, ddp, main
from fault_nonfinite_forward import TRIGGER, Net, sequences
from torch import nn


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = ddp(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for tokens, target in run.track_data(sequences(25)):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(tokens), target)
        loss.backward()
        run.note_loss(loss.detach())
        optimizer.step()


CASE = Case("fault_ddp_nonfinite", train, expect=("nonfinite_origin",), trigger=TRIGGER, within=0,
            world_size=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
