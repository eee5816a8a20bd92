"""tuimon's training side: embed a :class:`Monitor` in a PyTorch loop (or use ``tuimon run``).

This package must never import textual, sqlite-utils or the ``tuimon`` app: it runs inside the
training process, where every import and every microsecond counts. Heavy names are imported
lazily so that ``publisher.protocol`` stays importable without torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Monitor"]


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from publisher.monitor import Monitor

        return Monitor
    raise AttributeError(f"module 'publisher' has no attribute {name!r}")
