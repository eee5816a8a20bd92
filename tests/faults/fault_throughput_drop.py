"""Fault: throughput drop mid-run. From step 61 every step also waits 60 ms on something outside the
model (a synchronous upload of metrics added to the loop, a throttled device): the same training,
over 20x slower. Expected: ``throughput_drop`` once the slow steps fill the detector's window.
"""

import time

import torch
from _harness import Case, Run, batches, main, mlp, train_step

TRIGGER = 60
STALL_S = 0.06


def train(run: Run) -> None:
    model = mlp((8, 64, 64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run.watch([optimizer], model)
    for step, batch in batches(85):
        train_step(model, optimizer, batch)
        if step >= TRIGGER:
            time.sleep(STALL_S)


CASE = Case("fault_throughput_drop", train, expect=("throughput_drop",), trigger=TRIGGER, within=25)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
