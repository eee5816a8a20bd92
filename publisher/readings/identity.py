"""Which run, rank and world this process is, from the environment launchers set.

``torchrun``, ``torch.multiprocessing.spawn`` under ``tuimon run``, Slurm wrappers and
``accelerate launch`` all export ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (the ``torch.distributed``
environment convention); a process group, once up, says the same. Reading the environment first
means a Monitor created before ``init_process_group`` still knows its rank.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch


def env_int(name: str) -> int | None:
    """An integer environment variable, None when it is unset or not an integer."""
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _env_or_group(name: str, read: Callable[[Any], int], default: int) -> int:
    """``$name``, else what ``read`` says of the torch.distributed process group once it is up,
    else ``default``."""
    value = env_int(name)
    if value is not None:
        return value
    dist = torch.distributed
    return read(dist) if dist.is_available() and dist.is_initialized() else default


def default_rank() -> int:
    """``$RANK``, else the torch.distributed rank once a process group is up, else 0."""
    return _env_or_group("RANK", lambda dist: dist.get_rank(), 0)


def default_world_size() -> int:
    """``$WORLD_SIZE``, else the process group's size, else 1."""
    return _env_or_group("WORLD_SIZE", lambda dist: dist.get_world_size(), 1)


def local_rank() -> int:
    """``$LOCAL_RANK`` (the process's index on its node), else 0."""
    return env_int("LOCAL_RANK") or 0


def endpoint_for(endpoint: str | None, local_rank: int) -> str | None:
    """The PUB address of one process: a fixed TCP port is shifted by the local rank.

    Several processes on a node cannot bind one port; ``tcp://127.0.0.1:5555`` thus becomes
    5555 for local rank 0, 5556 for local rank 1, and so on. Other addresses are used as given.
    """
    if not endpoint or not endpoint.startswith("tcp://") or local_rank == 0:
        return endpoint
    address, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        return endpoint
    return f"{address}:{int(port) + local_rank}"


def default_run_name() -> str:
    """``$TUIMON_RUN``, else a timestamp (set TUIMON_RUN so that all ranks share one name)."""
    return os.environ.get("TUIMON_RUN") or time.strftime("run-%Y%m%d-%H%M%S")


def describe_model(model: torch.nn.Module | None) -> dict[str, Any] | None:
    """Class name and parameter counts, for ``run_start``: enough to tell two runs' models apart."""
    if model is None:
        return None
    params = list(model.parameters())
    return {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }
