"""Fault: a decay written per epoch, applied per step, on a tiny language model trained with AdamW.
``LambdaLR(lambda epoch: 0.5 ** epoch)`` ("halve the rate every epoch"), stepped after every
optimizer step: from 3e-3 the rate is 1e-4 of its peak by step 14 and 1e-30 by step 100. AdamW's
normalised updates are ``lr``-sized, so from then on they vanish below the weights' resolution and
the next-token loss stays where it was. Expected: ``lr_vanished`` 50 steps after the rate crossed
1e-4 of its peak (~step 64).
"""

import torch
from _harness import Case, Run, TiedLM, main, predict_next, token_batches


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5**epoch)
    run.watch([optimizer], model)
    for _, tokens in token_batches(120):
        optimizer.zero_grad()
        predict_next(model, tokens)
        optimizer.step()
        schedule.step()  # the bug: once a step, not once an epoch


CASE = Case("fault_lr_decayed_away", train, expect=("lr_vanished",), trigger=0, within=80)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
