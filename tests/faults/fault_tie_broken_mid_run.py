"""Fault: a weight tie broken mid-run. A tiny language model whose output head shares the embedding
matrix trains normally; at loop index 50 a new phase gives the head its own learning rate, and the
code that does it re-creates the head's weight as a new ``nn.Parameter`` (a copy) and adds it to
the optimizer as a param group. From then on embedding and head are two tensors that start equal
and drift apart, silently. Steps of ~10 ms. Expected: ``tie_broken`` within max(2 steps, 1 s).
"""

import torch
from _harness import Case, Run, TiedLM, main, paced, predict_next, token_batches
from torch import nn

TRIGGER = 50
STEP_S = 0.01


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    for step, tokens in paced(token_batches(TRIGGER + 30), STEP_S):
        if step == TRIGGER:  # the bug: a copy, where only the learning rate was meant to change
            model.head.weight = nn.Parameter(model.head.weight.detach().clone())
            optimizer.add_param_group({"params": [model.head.weight], "lr": 3e-3})
        optimizer.zero_grad()
        predict_next(model, tokens)
        optimizer.step()


CASE = Case("fault_tie_broken_mid_run", train, expect=("tie_broken",), trigger=TRIGGER, within=2,
            within_s=1.0, step_s=STEP_S)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
