"""The canonical event kinds: one name per symptom, shared by detectors, runbooks and the viewer.

Detectors emit only these kinds; every kind has a runbook in ``incidents/runbooks/`` (a test
checks both directions). Adding a kind means adding its runbook.
"""

from __future__ import annotations

from typing import NamedTuple


class EventKind(NamedTuple):
    name: str
    default_severity: str
    summary: str


EVENT_KINDS: dict[str, EventKind] = {
    kind.name: kind
    for kind in (
        # Numerical failures.
        EventKind("nonfinite_loss", "critical", "loss is NaN or Inf"),
        EventKind("nonfinite_grad", "critical", "a gradient holds NaN or Inf"),
        EventKind("nonfinite_param", "critical", "a parameter holds NaN or Inf"),
        EventKind("nonfinite_origin", "critical",
                  "where a NaN or Inf came from: the module, forward or backward, reproduced or not"),
        # Optimisation health.
        EventKind("loss_spike", "warning", "loss jumped far above its recent level"),
        EventKind("loss_plateau", "warning", "loss is not decreasing"),
        EventKind("grad_explosion", "warning", "gradient norm far above its recent level"),
        EventKind("vanishing_gradient", "warning", "gradients too small to train"),
        EventKind("dead_activations", "warning", "a layer outputs (almost) only zeros"),
        EventKind("update_ratio", "warning", "weight update / weight ratio out of range"),
        EventKind("chance_loss", "warning", "the loss sits at chance level: the model learns nothing"),
        EventKind("clip_noop", "warning", "gradient clipping ran before there were gradients to clip"),
        EventKind("loss_input_mismatch", "warning",
                  "a loss given the wrong kind of input (probabilities where it takes logits, ...)"),
        EventKind("lr_vanished", "warning", "the learning rate decayed to nothing while training goes on"),
        # Speed.
        EventKind("throughput_drop", "warning", "throughput fell well below its recent level"),
        EventKind("step_time_outlier", "info", "one step took far longer than usual"),
        EventKind("data_bottleneck", "warning", "waiting for data dominates the step"),
        EventKind("memory_growth", "warning", "host or GPU memory keeps growing across steps"),
        # A job of many ranks (judged by the relay at the top of the tree).
        EventKind("straggler", "warning", "one rank holds the others back (data wait or compute)"),
        EventKind("hang", "critical", "the step stopped advancing while heartbeats continue"),
        # A stall seen by the rank itself (publisher/wire/stall.py; stuck is a `hang`).
        EventKind("collective_wait", "info", "the training thread waits in a collective for another rank"),
        EventKind("busy_pause", "info", "the training thread is busy outside its steps (evaluation, saving)"),
        EventKind("rank_lost", "critical", "a rank or relay stopped sending heartbeats"),
        # A run held against a baseline recording (made by the viewer: tuimon/compare/band.py).
        EventKind("baseline_departure", "warning", "the run left its baseline's band (loss, throughput)"),
        # Data.
        EventKind("duplicate_batches", "warning", "the same batches come again (across workers or epochs)"),
        EventKind("single_class_labels", "warning", "every training label is the same class"),
        EventKind("class_sorted_batches", "warning", "each batch holds one class while the data holds many"),
        # GPUs (NVML).
        EventKind("gpu_imbalance", "warning", "one GPU is far less busy than the others"),
        EventKind("gpu_low_util", "warning", "GPUs are mostly idle"),
        EventKind("gpu_throttle", "warning", "a GPU is throttling (thermal or power)"),
        EventKind("gpu_ecc", "critical", "a GPU reports ECC memory errors"),
        # Training invariants (rules every healthy run keeps; after TrainCheck, OSDI 2025).
        EventKind("optimizer_noop", "critical", "optimizer.step() left its parameters unchanged"),
        EventKind("missing_gradient", "critical", "a trained parameter never receives a gradient"),
        EventKind("stale_gradients", "critical", "gradients are not cleared between steps"),
        EventKind("eval_mode_training", "warning", "the model is trained while in eval() mode"),
        EventKind("replica_divergence", "critical", "data-parallel replicas hold different weights"),
        EventKind("unowned_parameters", "info", "trainable parameters that no optimizer owns"),
        EventKind("unowned_tensors", "warning", "tensors outside the model get gradients no optimizer uses"),
        EventKind("frozen_param_changed", "critical", "a frozen parameter changed"),
        EventKind("tie_broken", "warning", "parameters meant to be one tensor have come apart"),
        # Monitoring itself (publisher/telemetry_errors.py): a part failed, the rest went on.
        EventKind("telemetry_error", "info",
                  "a part of tuimon's monitoring failed: its figures are missing, the rest goes on"),
    )
}
