"""Fault: a forgotten per-step debug routine. From loop index 100 every step also dumps the weights
as text for a diff, synchronously (left in after chasing a numerical bug): each step takes ~170 ms
instead of ~10 ms, 17x slower, and nothing else changes. Expected: ``throughput_drop`` within
max(10 steps, 1 s) of the change.

(The run stops 20 slow steps after the change, not after 200 more: that is ~3.6 s already, twice
the allowance, and a drop reported later is a failure either way.)
"""

import time

import torch
from _harness import Case, Run, batches, main, mlp, paced, train_step
from torch import nn

TRIGGER = 100
STEP_S = 0.01
DEBUG_S = 0.17


def dump_weights(model: nn.Module) -> str:
    """The debug routine: the first values of every weight as text, then a wait standing for the
    synchronous write (to a network disk) that makes it cost ~17 steps."""
    text = "\n".join(f"{name} {p.detach().flatten()[:8].tolist()}" for name, p in model.named_parameters())
    time.sleep(DEBUG_S)
    return text


def train(run: Run) -> None:
    model = mlp((8, 64, 64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for step, batch in paced(batches(TRIGGER + 20), STEP_S):
        train_step(model, optimizer, batch)
        if step >= TRIGGER:
            dump_weights(model)


CASE = Case("fault_debug_slowdown", train, expect=("throughput_drop",), trigger=TRIGGER, within=10,
            within_s=1.0, step_s=STEP_S)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
