"""Fault: a weight tie lost when loading a checkpoint. A tiny language model's output head shares
the embedding matrix (``head.weight = embed.weight``). The checkpoint holds separate copies of the
two (saved with ``{k: v.clone() for k, v in model.state_dict().items()}``); the model is rebuilt on
the meta device and loaded with ``load_state_dict(state, assign=True)``, which assigns each entry
its own tensor: two parameters with equal values, no longer one. Training moves them apart and
nothing fails. Expected: ``tie_broken`` within 2 steps of the start of training.
"""

import torch
from _harness import Case, Run, TiedLM, main, predict_next, token_batches


def reload(model: TiedLM) -> TiedLM:
    """Save a checkpoint and build the model from it the way big models are loaded (meta device,
    tensors assigned rather than copied): the bug is in this pairing."""
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with torch.device("meta"):
        fresh = TiedLM()
    fresh.load_state_dict(state, assign=True)
    return fresh


def train(run: Run) -> None:
    torch.manual_seed(0)
    model = reload(TiedLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    for _, tokens in token_batches(30):
        optimizer.zero_grad()
        predict_next(model, tokens)
        optimizer.step()


CASE = Case("fault_tie_broken_on_load", train, expect=("tie_broken",), trigger=0, within=2)

if __name__ == "__main__":
    raise SystemExit(main(CASE))
