"""A small language model trained on two torch threads, with no tuimon code in it, that reports how
its training thread spent its time: the check that monitoring leaves torch's thread pool alone.

At the end it prints one line, ``off_cpu=S native_threads=N``:

- ``off_cpu``: the share of the training loop's wall time the training thread spent off a CPU
  (waiting for the GIL, for I/O, for torch's pool threads woken from sleep);
- ``native_threads``: the most threads seen in the process, while it trained, that are neither
  Python threads nor ZeroMQ's (``ZMQbg/...``): torch's OpenMP pool threads, one less than the
  thread count for each thread that ran a parallel torch operation.
"""

import argparse
import os
import threading
import time

import torch
from torch import nn
from torch.nn import functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(args.threads)
VOCAB, CONTEXT, BATCH, WIDTH = 65, 64, 12, 64  # logits of 49,920 values: a parallel op to measure them


def native_threads() -> int:
    python = {thread.native_id for thread in threading.enumerate()}
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read()
        except OSError:
            continue  # ended meanwhile
        count += int(tid) not in python and not name.startswith("ZMQbg")
    return count


torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
model = nn.ModuleDict({"embed": nn.Embedding(VOCAB, WIDTH), "body": nn.TransformerEncoder(layer, 2),
                       "head": nn.Linear(WIDTH, VOCAB)})
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
mask = nn.Transformer.generate_square_subsequent_mask(CONTEXT)
data = (torch.arange(100_000) * 7 % VOCAB).long()

most = 0
wall = cpu = 0.0
for step in range(args.steps):
    starts = torch.randint(len(data) - CONTEXT - 1, (BATCH,))
    x = torch.stack([data[i:i + CONTEXT] for i in starts])
    y = torch.stack([data[i + 1:i + 1 + CONTEXT] for i in starts])
    started, cpu_started = time.perf_counter(), time.thread_time()
    logits = model["head"](model["body"](model["embed"](x), mask=mask, is_causal=True))
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step >= 10:  # after the first steps: start-up, and the monitor's first looks
        wall += time.perf_counter() - started
        cpu += time.thread_time() - cpu_started
    if step % 5 == 4:
        most = max(most, native_threads())
print(f"off_cpu={max(0.0, 1 - cpu / wall):.4f} native_threads={most}", flush=True)
