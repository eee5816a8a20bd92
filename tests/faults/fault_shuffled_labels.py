"""Fault: labels shuffled apart from the inputs (a pipeline that shuffles features and labels with
two different permutations). Every step looks normal, the loss is finite and smooth, gradients
flow; but there is nothing to learn, and the cross-entropy stays at chance, log(10) = 2.30.
Expected: ``loss_plateau`` once the loss has had time to show it is not decreasing.
"""

import torch
from _harness import Case, Run, classify, labelled, main, mlp


def train(run: Run) -> None:
    model = mlp((16, 64, 64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    run.watch([optimizer], model)
    for _, batch in labelled(160, shuffle_labels=True):
        optimizer.zero_grad()
        classify(model, batch)
        optimizer.step()


CASE = Case("fault_shuffled_labels", train, expect=("loss_plateau",), trigger=0, within=150)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
