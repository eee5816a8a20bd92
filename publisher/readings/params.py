"""The parameters being trained, as the optimizers see them.

The gradient norm, the layer samples and the invariants must agree on one list: the parameters
of every watched optimizer (each once, in order), or the model's trainable ones when no optimizer
is known. ``add_param_group()`` (progressive unfreezing) changes the list during training, so it
is re-read when the number of parameter groups moves, a check that costs a few attribute reads.
"""

from __future__ import annotations

import torch


class TrainedParams:
    """The watched optimizers (the first is the primary one, whose lr is the run's) and their params."""

    def __init__(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizers: list[torch.optim.Optimizer] = [optimizer] if optimizer is not None else []
        #: The parameters as of the last read (an attribute: the hot path tests it every step);
        #: :meth:`current` re-reads them first when the optimizers changed.
        self.params = self._read()
        self._n_groups = self._count_groups()

    @property
    def primary(self) -> torch.optim.Optimizer | None:
        return self.optimizers[0] if self.optimizers else None

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> bool:
        """Watch one more optimizer; False if it was already watched."""
        if any(optimizer is known for known in self.optimizers):
            return False
        self.optimizers.append(optimizer)
        self.params = self._read()
        self._n_groups = self._count_groups()
        return True

    def current(self) -> list[torch.Tensor]:
        """The trained parameters, re-read when ``add_param_group()`` changed an optimizer."""
        n_groups = self._count_groups()
        if n_groups != self._n_groups:
            self._n_groups = n_groups
            self.params = self._read()
        return self.params

    def device(self) -> torch.device | None:
        """Where the parameters live (the first one's device), None when there are none."""
        return self.params[0].device if self.params else None

    def _count_groups(self) -> int:
        return sum(len(optimizer.param_groups) for optimizer in self.optimizers)

    def _read(self) -> list[torch.Tensor]:
        if self.optimizers:
            groups = [group for optimizer in self.optimizers for group in optimizer.param_groups]
            return list({id(p): p for group in groups for p in group["params"]}.values())
        if self.model is not None:
            return [p for p in self.model.parameters() if p.requires_grad]
        return []
