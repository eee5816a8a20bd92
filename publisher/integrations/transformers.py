"""``TuimonCallback`` for the Hugging Face ``transformers.Trainer``: one Monitor per rank.

    from publisher.integrations.transformers import TuimonCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[TuimonCallback(run="exp1", record="runs/exp1.jsonl")])

The callback takes the Monitor's keyword arguments; everything a Monitor does (detectors,
invariants, layer samples, GPU readings, recording) is the Monitor's. The Monitor starts at
``on_train_begin`` (the Trainer has built and wrapped the optimizer by then) with the rank and world
size of the Trainer's arguments (``args.process_index``, ``args.world_size``) and closes at
``on_train_end``. The Trainer reports no exception to its callbacks: a training that raises is
closed as failed when the interpreter exits (the Monitor's own rule), or when the next
``train()`` of the same callback begins.

What each step reports, and where it comes from (the Trainer's callback events:
https://huggingface.co/docs/transformers/main_classes/callback):

- **the step**: ``on_optimizer_step`` (transformers 4.42+), after ``optimizer.step()`` and before the
  gradients are cleared, as ``Monitor.step`` wants it: one step per optimizer step whatever
  ``gradient_accumulation_steps``, numbered as ``state.global_step`` is after it;
- **loss**: the Trainer hands callbacks no loss, and logs one only every ``logging_steps``. A
  forward hook on the model reads the loss each training forward returns (``outputs.loss``,
  detached, left on its device: no synchronisation) and combines a step's micro-batches the way
  the Trainer adds them up for its logged loss: their sum when the Trainer passed
  ``num_items_in_batch`` (each loss is then normalised by the tokens of the whole accumulated
  batch, times the world size with ``average_tokens_across_devices``), else their mean. The
  Trainer's logged ``loss`` is the mean of these over its logging window (equal at
  ``logging_steps=1``). Approximate where the Trainer computes its own loss from the outputs
  (label smoothing, ``compute_loss_func``, a subclass's ``compute_loss``): the model's loss, or none
  when the model was given no labels;
- **lr**: read by the Monitor from the optimizer at the step: the ``learning_rate`` the Trainer logs
  (its scheduler steps afterwards);
- **grad_norm**: the Monitor's, on the gradients the optimizer used, i.e. after the Trainer's
  clipping (``max_grad_norm``, 1.0 by default), as for a hand-written loop that clips; the Trainer
  logs the norm before clipping, and its logs arrive only after the gradients are cleared
  (``on_log`` follows ``on_step_end``);
- **samples, tokens**: the shape of each training forward's ``input_ids``.

Evaluation: its forwards run in ``eval()`` mode without gradients, so they are not training
micro-batches; the invariants ignore them too. Its time lands in the next step's ``step_time``,
which the speed detectors take for a pause (``step_time_outlier``, info). Not measured: the wait
for data and batch fingerprints (the Trainer fetches a step's batches ahead, out of sight).
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
