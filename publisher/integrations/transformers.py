"""``TuimonCallback`` for the Hugging Face ``transformers.Trainer``: one Monitor per rank.

    from publisher.integrations.transformers import TuimonCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[TuimonCallback(run="exp1", record="runs/exp1.jsonl")])

The callback takes the Monitor's keyword arguments; everything a Monitor does (detectors,
invariants, layer samples, GPU readings, recording) is the Monitor's. The Monitor starts at
``on_train_begin`` with the Trainer's rank and world size and closes at ``on_train_end`` (a
training that raises is closed as failed at exit, or when the next ``train()`` begins). A step is
``on_optimizer_step`` (transformers 4.42+); the Trainer hands callbacks no loss, so a forward hook
reads ``outputs.loss`` of each training forward (left on its device) and combines a step's
micro-batches as the Trainer adds them up for its logged loss; samples and tokens come from
``input_ids``. Evaluation forwards (``eval()``, no gradients) are not training micro-batches.
Where each number comes from, and how it compares with the Trainer's logs: docs/integrations.md,
"Hugging Face ``transformers.Trainer``".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from publisher.extras import missing

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ModuleNotFoundError as error:
    raise missing(error, extra="transformers", needed_by=__name__) from None

from publisher.integrations.session import CallbackSession
from publisher.monitor import Monitor
from publisher.readings.batches import batch_size


class TuimonCallback(TrainerCallback):
    """Watches a ``transformers.Trainer`` run on this rank; takes ``Monitor``'s keyword arguments."""

    def __init__(self, **monitor_options: Any) -> None:
        self._session = CallbackSession("transformers", monitor_options)
        #: The Trainer multiplies a loss normalised across devices by this (``compute_loss``).
        self._across_devices = 1

    @property
    def monitor(self) -> Monitor | None:
        """This rank's Monitor while training runs (None before, after, and under ``tuimon run``)."""
        return self._session.monitor

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: torch.nn.Module | None = None, optimizer: Any = None, **kwargs: Any) -> None:
        if model is None or optimizer is None:
            return
        # Accelerate's AcceleratedOptimizer keeps the torch optimizer, whose hooks fire, as `.optimizer`.
        inner = getattr(optimizer, "optimizer", optimizer)
        self._across_devices = args.world_size if getattr(args, "average_tokens_across_devices", False) else 1
        if self._session.start(model, [inner], rank=args.process_index, world_size=args.world_size,
                               run=args.run_name, config=args.to_dict(), device=args.device):
            self._session.own(model.register_forward_hook(self._forward, with_kwargs=True))

    def _forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
        """A forward of the model: a training micro-batch when in train mode with gradients on."""
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation, prediction, generation
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            loss = None
        shares = kwargs.get("num_items_in_batch") is not None
        if loss is not None:
            loss = loss.detach()
            if shares and self._across_devices > 1:
                loss = loss * self._across_devices
        ids = kwargs.get("input_ids", args[0] if args else None)
        tokens = ids.numel() if isinstance(ids, torch.Tensor) else 0
        self._session.note_loss(loss, shares=shares, samples=batch_size(ids), tokens=tokens)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        self._session.step(state.global_step + 1)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._session.close()
