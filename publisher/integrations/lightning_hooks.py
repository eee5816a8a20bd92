"""The Lightning callback's hooks, apart from the package that calls them.

Lightning ships as ``lightning`` (``lightning.pytorch``) and as the older ``pytorch_lightning``, and
each Trainer accepts only callbacks derived from its own ``Callback`` class. The hooks are written
once here, without importing either; :mod:`publisher.integrations.lightning` and
:mod:`publisher.integrations.pytorch_lightning` each put them on their package's ``Callback``.

What each step reports, and where it comes from (Lightning's callback hooks:
https://lightning.ai/docs/pytorch/stable/extensions/callbacks.html):

- **the Monitor** starts at ``on_train_start`` (the strategy has set up the optimizers and wrapped
  the model) with ``trainer.global_rank`` and ``trainer.world_size``, the module's ``hparams`` as
  its config, ``trainer.optimizers[0]`` as the primary optimizer and the others added (a GAN in
  manual optimization). It closes at ``on_train_end``, or at ``on_exception`` with the exception
  (``run_end`` then says failed or interrupted);
- **the step**: ``trainer.global_step``, Lightning's count of optimizer steps, read at
  ``on_train_batch_end``: a batch after which it moved ends a step. With
  ``accumulate_grad_batches`` that is every k-th batch; in manual optimization every optimizer's
  step counts (two optimizers: two a batch). Gradients are still there: automatic optimization
  clears them only before the next backward; a manual ``training_step`` that calls
  ``zero_grad()`` after ``step()`` leaves the Monitor's gradient norm and layer samples nothing to
  read;
- **loss**: what ``training_step`` returned (``outputs``, detached, on its device: no
  synchronisation). In automatic optimization Lightning has divided it by
  ``accumulate_grad_batches``, so a step's loss is the sum over its batches, i.e. their mean loss;
  in manual optimization the mean of the losses returned since the previous step (a
  ``training_step`` that returns nothing reports no loss);
- **lr** and **grad_norm**: the Monitor's, from the primary optimizer and the gradients it used
  (after any ``gradient_clip_val`` clipping);
- **samples**: the leading dimension of each batch's first tensor.

Validation and the sanity check run in ``eval()`` mode without gradients and outside
``on_train_batch_end``; their time lands in the next step's ``step_time`` (a pause to the speed
detectors).
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
