"""The base of everything that hooks into the user's training: metered, switched off when it breaks.

The invariant checks and root discovery put hooks on the user's optimizers, modules and tensors.
A bug in one of them must never stop a training run, and what they cost must be known: each is a
:class:`Check`, which its owner switches off (``dead``) when it raises and whose hooks run inside
a shared :class:`~publisher.measure.budget.CostMeter`.
"""

from __future__ import annotations

from publisher.measure.budget import CostMeter


class Check:
    """Base of every check: the invariant names it serves and a flag set when it broke.

    A check that raises is switched off by the checker (its invariants become ``unchecked`` with
    the error), so a bug in a check never stops a training run. ``meter`` (set by the checker)
    times the hooks a check installs itself.
    """

    names: tuple[str, ...] = ()
    dead: bool = False
    meter: CostMeter = CostMeter()

    def close(self) -> None:
        """Remove whatever hooks the check installed."""
