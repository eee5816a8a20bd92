"""A tiny GPT-2 and learnable token rows, built here (nothing downloaded): what the framework tests
(``test_integrations.py``) and the callback benchmark (``benchmarks/callbacks.py``) train."""

from __future__ import annotations

from typing import Any

import torch


def tiny_gpt2(*, layers: int = 2, width: int = 32, heads: int = 2, vocab: int = 64, positions: int = 32,
              tied: bool = True) -> Any:
    """A seeded ``GPT2LMHeadModel`` from a local ``GPT2Config``."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                                     n_positions=positions, bos_token_id=0, eos_token_id=0,
                                     tie_word_embeddings=tied)
    return transformers.GPT2LMHeadModel(config)


def token_rows(count: int, *, vocab: int = 64, length: int = 16, seed: int = 0) -> torch.Tensor:
    """Rows that count up in strides from random starts: learnable (the next token follows from the
    last), so a healthy run stays healthy; random tokens would sit at chance."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab, (count, 1), generator=g)
    strides = torch.randint(1, 4, (count, 1), generator=g)
    return (starts + strides * torch.arange(length)) % vocab


class LmRows(torch.utils.data.Dataset):
    """Token rows as the Hugging Face Trainer takes them: the inputs are their own labels (causal LM)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[index], "labels": self.rows[index]}
