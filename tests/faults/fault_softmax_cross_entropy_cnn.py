"""Fault: a CNN whose last layer is ``Softmax``, trained with ``nn.CrossEntropyLoss`` (the module
calls ``F.cross_entropy``, which applies ``log_softmax`` again). Loaded through a shuffling
DataLoader, as a user would. Expected: ``loss_input_mismatch`` within 3 steps.
"""

import torch
from _harness import Case, Run, cnn, fit, images, main
from torch import nn
from torch.utils.data import DataLoader


def train(run: Run) -> None:
    model = cnn(head=nn.Softmax(dim=1), seed=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    loss = nn.CrossEntropyLoss()
    for batch in run.track_data(DataLoader(images(640, seed=2), batch_size=32, shuffle=True)):
        fit(model, optimizer, batch, loss)


CASE = Case("fault_softmax_cross_entropy_cnn", train, expect=("loss_input_mismatch",), trigger=0, within=3)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
