"""Settings of the invariant checker and the names of the invariants it reports.

Kept free of torch so that the viewer and the Monitor's argument parsing can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Invariant status name -> the event kind (``publisher.event_kinds``) its violation emits.
KIND_OF: dict[str, str] = {
    "optimizer_changes_params": "optimizer_noop",
    "params_receive_grads": "missing_gradient",
    "grads_cleared": "stale_gradients",
    "model_in_train_mode": "eval_mode_training",
    "replicas_consistent": "replica_divergence",
    "optimizer_owns_trainables": "unowned_parameters",
    "frozen_stay_frozen": "frozen_param_changed",
}
INVARIANT_NAMES: tuple[str, ...] = tuple(KIND_OF)


@dataclass(frozen=True)
class InvariantConfig:
    """How often and how strictly the invariants are checked.

    Every check runs on each of the first ``dense_steps`` steps of an optimizer (bugs present from
    the start show at once), then on every ``check_every``-th step; a suspicious result asks for a
    confirming check on the very next step, so a fault is reported at most ``check_every + 1``
    steps after it starts. With the default, the checker's own time measured about 2 % of a 1 ms
    CPU step and 0.15 % of a 20 ms one on a shared 2-core machine
    (benchmarks/invariants_overhead.py); it is Python work, so it does not grow with model size.
    """

    #: A parameter that requires grad must receive a non-zero gradient within this many steps
    #: of its optimizer (counted from when it first requires grad).
    grad_window: int = 5
    #: Every check runs on each of an optimizer's first ``dense_steps`` steps...
    dense_steps: int = 5
    #: ...and then on every ``check_every``-th step.
    check_every: int = 10
    #: Replica comparison (a collective): each of the first ``dense_steps`` steps, then every
    #: ``replica_every`` steps.
    replica_every: int = 10
    #: Relative tolerance of the replica comparison (per parameter, on float64 L1 and L2 norms).
    replica_rtol: float = 1e-6
    #: A learning rate that was positive and then sits at exactly 0 for this many consecutive
    #: steps makes ``step()`` a no-op (the last step of a schedule at 0 is fine).
    zero_lr_steps: int = 3
    #: At most this many elements of each parameter are compared before/after a step.
    probe_elements: int = 1024
    #: Invariants (names from :data:`INVARIANT_NAMES`) not to check at all.
    disabled: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in ("grad_window", "dense_steps", "check_every", "replica_every", "zero_lr_steps",
                     "probe_elements"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"InvariantConfig.{name} must be an integer >= 1, got {value!r}")
        if not 0 <= self.replica_rtol < 1:
            raise ValueError(f"InvariantConfig.replica_rtol must be in [0, 1), got {self.replica_rtol!r}")
        object.__setattr__(self, "disabled", frozenset(self.disabled))
        unknown = sorted(self.disabled - set(INVARIANT_NAMES))
        if unknown:
            raise ValueError(
                f"InvariantConfig.disabled names unknown invariants {unknown}; known: {list(INVARIANT_NAMES)}"
            )
