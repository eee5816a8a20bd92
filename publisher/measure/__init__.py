"""What every measurement taken inside the training shares, below the statistics and the checks
that use it.

- ``budget.py``: what a measurement may cost: the typical step time, a cost budget per measurement
  that spaces it out, schedules, the cost meter;
- ``check.py``: :class:`~publisher.measure.check.Check`, the base of everything that hooks into
  the user's training (the invariant checks, root discovery): metered, switched off when it breaks;
- ``tensors.py``: the torch helpers the statistics and the invariant checks must agree on
  (parameter names, the module inside DDP and ``torch.compile`` wrappers, strided samples,
  stacking across devices);
- ``fetch.py``: device numbers brought to the host without a synchronisation (the Monitor's one
  copy per step, the invariant checks' pending verdicts).

They live in a folder of their own, rather than with one of their users, so that the per-layer
statistics (``stats/``) and the invariant checks (``invariants/``) reach them directly and
neither depends on the other for them.
"""
