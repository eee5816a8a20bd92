"""Fault: a memory leak from keeping graphs alive. From step 21 the loop keeps each step's loss
*tensor* for logging (``history.append(loss)`` instead of ``loss.item()``): every loss holds its
autograd graph and with it the step's saved activations, about 5 MiB a step here, until the process
runs out of memory hours later. Expected: ``memory_growth`` (host memory, on a CPU).
"""

import torch
from _harness import Case, Run, batches, main, mlp, release_free_memory
from torch import nn

TRIGGER = 20
#: The detector names a climb once it has taken a quarter of the leak budget (256 MiB, ~50 steps
#: here) and its floors, one per 16 steps, rose steadily: about 75 steps after the trigger, 90 when
#: an allocator's jump spoils one verdict. The run goes on long enough for five verdicts after the
#: first, and stays under the 1 GiB the leak is allowed to take before it must have been named.
STEPS = 180


def train(run: Run) -> None:
    release_free_memory()
    model = mlp((64, 1024, 1024, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch([optimizer], model, manual=True)
    history = []
    for step, (x, y) in batches(STEPS, batch=512, dim=64):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward(retain_graph=step >= TRIGGER)
        optimizer.step()
        if step >= TRIGGER:
            history.append(loss)  # the bug: keeps the graph (and its activations) alive
        run.step(loss)


CASE = Case("fault_memory_leak", train, expect=("memory_growth",), trigger=TRIGGER, within=10,
            within_s=1.0, own_process=True, leak=True)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
