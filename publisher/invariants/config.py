"""Settings of the invariant checker and the names of the invariants it reports.

Kept free of torch so that the viewer and the Monitor's argument parsing can import it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from publisher.measure.budget import check_share

#: Invariant status name -> the event kind (``publisher.wire.event_kinds``) its violation emits.
KIND_OF: dict[str, str] = {
    "optimizer_changes_params": "optimizer_noop",
    "params_receive_grads": "missing_gradient",
    "grads_cleared": "stale_gradients",
    "model_in_train_mode": "eval_mode_training",
    "replicas_consistent": "replica_divergence",
    "optimizer_owns_trainables": "unowned_parameters",
    "frozen_stay_frozen": "frozen_param_changed",
    "ties_hold": "tie_broken",
}
INVARIANT_NAMES: tuple[str, ...] = tuple(KIND_OF)


@dataclass(frozen=True)
class InvariantConfig:
    """How often and how strictly the invariants are checked.

    Every check runs on each of the first ``dense_steps`` steps of an optimizer (bugs present from
    the start show at once), then on every ``check_every``-th step; a suspicious result asks for a
    confirming check on the very next step, so a fault is reported at most ``check_every + 1``
    steps after it starts (fewer where steps are long: ``check_within_s``). The checks are Python
    work in the optimizer's hooks, ~100-200 us per check on a shared CPU core whatever the model
    size: 0.5 % of a 20 ms step every 10 steps, but 2 % of a 1 ms one. Where they would cost more
    than ``budget`` of the step time (told by the Monitor), the period stretches beyond
    ``check_every`` up to ``max_check_every`` steps; the replica comparison keeps
    ``replica_every`` (every rank must join it at the same step).
    """

    #: A parameter that requires grad must receive a non-zero gradient within this many steps
    #: of its optimizer (counted from when it first requires grad).
    grad_window: int = 5
    #: Every check runs on each of an optimizer's first ``dense_steps`` steps...
    dense_steps: int = 5
    #: ...and then on every ``check_every``-th step...
    check_every: int = 10
    #: ...or less often, where checks would cost more than this share of the step time...
    budget: float = 0.0025
    #: ...but at least every ``max_check_every`` steps, and at least every ``check_within_s``
    #: seconds where steps are long (every step beyond): with the confirming step, a fault is
    #: reported within max(2 steps, ~1 s) of its start.
    max_check_every: int = 100
    check_within_s: float = 0.5
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
        for name in ("grad_window", "dense_steps", "check_every", "max_check_every", "replica_every",
                     "zero_lr_steps", "probe_elements"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"InvariantConfig.{name} must be an integer >= 1, got {value!r}")
        check_share(self.budget, "InvariantConfig.budget")
        if not self.check_within_s > 0:
            raise ValueError(f"InvariantConfig.check_within_s must be > 0, got {self.check_within_s!r}")
        if not 0 <= self.replica_rtol < 1:
            raise ValueError(f"InvariantConfig.replica_rtol must be in [0, 1), got {self.replica_rtol!r}")
        object.__setattr__(self, "disabled", frozenset(self.disabled))
        unknown = sorted(self.disabled - set(INVARIANT_NAMES))
        if unknown:
            raise ValueError(
                f"InvariantConfig.disabled names unknown invariants {unknown}; known: {list(INVARIANT_NAMES)}"
            )
