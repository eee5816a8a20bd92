"""Where a non-finite value came from, what to do with the step, and the evidence kept.

On the step where the gradients first turn non-finite, before the optimizer applies them
(:mod:`~publisher.nonfinite.guard`), the model's forward and backward are re-run on that step's
inputs with the same RNG state, with hooks on every module (:mod:`~publisher.nonfinite.origin`),
to name the first module that produced a NaN or Inf and whether the re-run reproduces it (a bug)
or not (a transient fault: Megatron-LM's rerun state machine makes the same distinction). The
inputs come from :mod:`~publisher.nonfinite.capture`; the evidence goes to a repro bundle
(:mod:`~publisher.nonfinite.bundle`).
"""
