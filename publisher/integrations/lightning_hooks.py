"""The Lightning callback's hooks, apart from the package that calls them.

Lightning ships as ``lightning`` (``lightning.pytorch``) and as the older ``pytorch_lightning``, and
each Trainer accepts only callbacks derived from its own ``Callback`` class. The hooks are written
once here, without importing either; :mod:`publisher.integrations.lightning` and
:mod:`publisher.integrations.pytorch_lightning` each put them on their package's ``Callback``.

The Monitor starts at ``on_train_start`` (optimizers set up, model wrapped) and closes at
``on_train_end`` or ``on_exception``. A step ends with a batch after which ``trainer.global_step``
moved (every k-th batch with ``accumulate_grad_batches``; every optimizer's step in manual
optimization); its loss is what ``training_step`` returned (left on its device), summed over the
step's batches in automatic optimization (Lightning divided each by k), averaged in manual. Where
each number comes from: docs/integrations.md, "Lightning".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from publisher.integrations.session import CallbackSession
from publisher.monitor import Monitor
from publisher.readings.batches import batch_size


class LightningHooks:
    """Lightning callback hooks driving a :class:`CallbackSession`; mixed into each package's ``Callback``."""

    def __init__(self, **monitor_options: Any) -> None:
        self._session = CallbackSession("lightning", monitor_options)
        self._last_step = 0

    @property
    def monitor(self) -> Monitor | None:
        """This rank's Monitor while training runs (None before, after, and under ``tuimon run``)."""
        return self._session.monitor

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_step = trainer.global_step
        self._session.start(pl_module, list(trainer.optimizers), rank=trainer.global_rank,
                            world_size=trainer.world_size, config=dict(pl_module.hparams),
                            device=pl_module.device)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            loss = None
        self._session.note_loss(None if loss is None else loss.detach(),
                                shares=pl_module.automatic_optimization, samples=batch_size(batch))
        if trainer.global_step > self._last_step:
            self._last_step = trainer.global_step
            self._session.step(trainer.global_step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._session.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._session.close(exception)
