"""A learning rate stuck at exactly 0 makes ``optimizer.step()`` a no-op (``optimizer_changes_params``).

Two shapes of the fault, read from ``param_groups`` in the step post-hook:

* a group whose lr was positive reaches 0 and stays there for ``zero_lr_steps`` steps while
  training goes on (a schedule decaying to 0 too early, a multiplicative drop gone wrong);
* every group of the optimizer has lr 0 for the first ``zero_lr_steps`` steps (lr read as 0).

Read on sampled steps; once a group that could be faulty is seen at 0, on every step until the
verdict, so "stays 0" counts consecutive steps. The event says when lr reached 0 as exactly as the
sampling allows ("at step N", or "between steps M and N").

Healthy look-alikes: warm-up from 0 (one step at 0), the last step of a cosine schedule at 0, and a
single group kept at lr 0 from the start while others train (a deliberate freeze).
The post-hook runs before the user's ``scheduler.step()``, so the lr read is the one the step used.
"""

from __future__ import annotations

from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import StatusBoard, WatchedOptimizer
from publisher.measure.budget import Schedule
from publisher.measure.check import Check

UPDATES = "optimizer_changes_params"


class ZeroLrCheck(Check):
    """Tracks, per param group, whether lr was ever positive and since when it has been 0."""

    names = (UPDATES,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer,
                 schedule: Schedule) -> None:
        self._board = board
        self._needed = config.zero_lr_steps
        self._watched = watched
        self.schedule = schedule
        self._source = ("learning rate", watched.index)
        self._was_positive: list[bool] = []
        self._last_positive: list[int | None] = []  # reported step of the last look that saw lr > 0
        self._zero_since: list[tuple[int, int] | None] = []  # (optimizer step index, reported step)
        self._violated = False

    def after_step(self, index: int, step: int) -> None:
        """Called on sampled steps; while a group sits at 0 it asks for every following step."""
        groups = self._watched.optimizer.param_groups
        rates = [self._watched.lr(g) for g in range(len(groups))]
        if not self._violated and len(rates) == len(self._was_positive) and all(r and r > 0 for r in rates):
            # The usual case, every group moving: remember it and return.
            self._was_positive = [True] * len(rates)
            self._last_positive = [step] * len(rates)
            self._zero_since = [None] * len(rates)
            return
        while len(self._was_positive) < len(groups):
            self._was_positive.append(False)
            self._last_positive.append(None)
            self._zero_since.append(None)
        stuck: list[int] = []
        zero_groups = 0
        for g, lr in enumerate(rates):
            if lr is None or lr != 0:
                if lr is not None and lr > 0:
                    self._was_positive[g] = True
                    self._last_positive[g] = step
                self._zero_since[g] = None
                continue
            zero_groups += 1
            since = self._zero_since[g]
            if since is None:
                since = self._zero_since[g] = (index, step)
            if index - since[0] + 1 >= self._needed:
                stuck.append(g)
        all_zero = zero_groups == len(groups) and not any(self._was_positive)
        if any(self._zero_since[g] is not None and (self._was_positive[g] or all_zero) and g not in stuck
               for g in range(len(groups))):
            self.schedule.request(index + 1)  # a group kept at 0 on purpose from the start is not watched
        self._report(index, step, len(groups), stuck, all_zero)

    def _report(self, index: int, step: int, n_groups: int, stuck: list[int], all_zero: bool) -> None:
        """Flag groups whose rate decayed to 0 and stayed there, or a rate that was never positive;
        or say the rate is positive again after a violation."""
        decayed = [g for g in stuck if self._was_positive[g]]
        opt = self._watched.index
        if decayed:
            zero_since = [since for since in (self._zero_since[g] for g in decayed) if since is not None]
            first = min(reported for _, reported in zero_since)
            last_positive = max(self._last_positive[g] or 0 for g in decayed)
            when = (f"at step {first}" if last_positive == first - 1
                    else f"between steps {last_positive + 1} and {first}")
            checked = index - min(checked_at for checked_at, _ in zero_since) + 1
            message = (f"optimizer {opt}: learning rate of param group(s) {decayed} reached 0 {when} and has "
                       f"stayed 0 for {checked} checked steps in a row while training continues: step() "
                       "changes nothing")
            details = {"optimizer": opt, "groups": decayed, "lr_zero_since_step": first,
                       "lr_last_positive_step": last_positive,
                       "likely_causes": ["a schedule that decays to 0 before the last step (total steps "
                                         "too small, scheduler stepped per batch instead of per epoch)",
                                         "a multiplicative lr drop with factor 0"]}
            self._flag(step, message, details, ("decayed", tuple(decayed)))
        elif all_zero and len(stuck) == n_groups:
            message = (f"optimizer {opt}: learning rate is 0 in every param group since its first step "
                       f"({index + 1} steps): step() changes nothing")
            details = {"optimizer": opt, "groups": list(range(n_groups)),
                       "likely_causes": ["lr parsed or scaled to 0 (integer division, lr * 0 batch scaling)",
                                         "a warm-up that never starts (warm-up length 0 or infinite)"]}
            self._flag(step, message, details, ("never positive",))
        elif self._violated:
            self._violated = False
            self._board.report(UPDATES, self._source, "unchecked", step,
                               f"optimizer {opt}: learning rate is positive again")

    def _flag(self, step: int, message: str, details: dict, key: tuple) -> None:
        self._violated = True
        self._board.violation(UPDATES, self._source, step, message, details, [key])
