"""Fault: a weight made in the script with ``requires_grad=True`` and never given to the optimizer.
A tiny language model with a learned output temperature and a learned positional bias written as
``torch.zeros(..., requires_grad=True)`` beside the model (the optimizer takes
``model.parameters()``): both get gradients every step and keep their initial values; their
``.grad`` grows without bound since nothing clears it. Expected: ``unowned_tensors`` (a warning)
at the first ownership check, naming the two tensors by shape; the model's own
parameters are all owned.
"""

import torch
from _harness import Case, Run, TiedLM, main, token_batches
from torch.nn import functional


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    temperature = torch.ones(1, requires_grad=True)  # the bug: in no optimizer
    position_bias = torch.zeros(11, 50, requires_grad=True)  # the bug: in no optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    run.watch([optimizer], model, manual=True)
    for _, tokens in token_batches(30):
        optimizer.zero_grad()
        logits = model(tokens[:, :-1]) / temperature + position_bias
        loss = functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        run.step(loss)


CASE = Case("fault_script_weight", train, expect=("unowned_tensors",), trigger=0, within=6)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
