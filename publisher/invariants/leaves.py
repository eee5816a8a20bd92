"""The leaf tensors a loss's autograd graph reaches: every tensor that will receive a gradient.

An optimizer owns parameters it was given; the model lists those registered in its module tree.
A layer kept in a plain Python list or dict (not an ``nn.ModuleList``/``ModuleDict``) or a weight
made with ``torch.randn(..., requires_grad=True)`` in the script is in neither, so checks that
start from the model or the optimizers cannot see it: it receives a gradient every step, nobody
steps it, nobody clears its ``.grad`` (which grows), and it keeps its initial values for ever.
The autograd graph of the loss sees it: each leaf that requires grad is reached through one
``AccumulateGrad`` node (PyTorch's autograd mechanics notes), whose ``variable`` is the tensor.

The walk follows ``next_functions`` from the loss's ``grad_fn``. They outlive ``backward()``
(only the saved tensors are freed), so a graph can be walked after the step too. It is Python
work (about a microsecond a node), done on a few sampled steps only.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import Any

import torch
from torch import nn

#: Graph nodes visited at most in one walk (a very large graph is walked in part).
MAX_NODES = 200_000

Leaves = dict[int, "weakref.ref[torch.Tensor]"]


def graph_leaves(loss: torch.Tensor, max_nodes: int = MAX_NODES) -> Leaves:
    """The leaves requiring grad that ``loss``'s graph reaches, by ``id``, weakly held."""
    leaves: Leaves = {}
    root = loss.grad_fn
    if root is None:
        return leaves
    visited: list[Any] = [root]  # keeps the nodes alive, so that their ids stay unique
    seen = {id(root)}
    stack = [root]
    while stack and len(visited) < max_nodes:
        node = stack.pop()
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves[id(variable)] = weakref.ref(variable)
            continue
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                visited.append(child)
                stack.append(child)
    return leaves


def persistent(earlier: Leaves, later: Leaves) -> list[torch.Tensor]:
    """Leaves that both walks reached: the same tensor on two steps, a trained weight's shape of
    life (an input that carries gradients, an adversarial example, is a new tensor every step)."""
    kept = []
    for key, ref in later.items():
        tensor = ref()
        if tensor is not None and key in earlier and earlier[key]() is tensor and tensor.requires_grad:
            kept.append(tensor)
    return kept


def where_kept(tensors: Sequence[torch.Tensor], roots: Sequence[nn.Module],
               frames: int = 30) -> dict[int, str]:
    """Names for tensors outside the model, by ``id``, where one can be found: a parameter of a
    module kept in a plain list, tuple or dict attribute of a module of ``roots`` (``blocks[1].weight``),
    else a variable of the training thread's frames that holds it (``temperature in train()
    (script.py:19)``). Called only to report, once: it looks through every module's attributes."""
    wanted = {id(t) for t in tensors}
    names: dict[int, str] = {}
    for root in roots:
        for path, module in root.named_modules():
            for attr, value in vars(module).items():
                items = value.items() if isinstance(value, dict) else (
                    enumerate(value) if isinstance(value, list | tuple) else ())
                for key, item in items:
                    if not isinstance(item, nn.Module):
                        continue
                    for name, param in item.named_parameters():
                        if id(param) in wanted and id(param) not in names:
                            prefix = f"{path}." if path else ""
                            names[id(param)] = f"{prefix}{attr}[{key!r}].{name}"
    frame: FrameType | None = sys._getframe(1)
    for _ in range(frames):
        if frame is None or len(names) == len(wanted):
            break
        for variable, value in frame.f_locals.items():
            if isinstance(value, torch.Tensor) and id(value) in wanted and id(value) not in names:
                code = frame.f_code
                file = code.co_filename.rsplit("/", 1)[-1]
                names[id(value)] = f"{variable} in {code.co_name}() ({file}:{frame.f_lineno})"
        frame = frame.f_back
    return names
