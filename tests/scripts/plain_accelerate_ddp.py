"""Plain data-parallel training through Hugging Face Accelerate, for `accelerate launch`; no tuimon code."""

import argparse

import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
args = parser.parse_args()

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
generator = torch.Generator().manual_seed(accelerator.process_index)
for _ in range(args.steps):
    loss = model(torch.randn(16, 8, generator=generator)).pow(2).mean()
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
