"""A learning rate stuck at exactly 0 makes ``optimizer.step()`` a no-op (``optimizer_changes_params``).

Two shapes of the fault, both read from ``param_groups`` after each step (a few dict reads, every
step, since "stays 0 for N consecutive steps" needs each step):

* a group whose lr was positive reaches 0 and stays there for ``zero_lr_steps`` steps while
  training goes on (a schedule decaying to 0 too early, a multiplicative drop gone wrong);
* every group of the optimizer has lr 0 for the first ``zero_lr_steps`` steps (lr read as 0).

Read every step (so the step where lr reached 0 is exact); once every group has been positive and
none is at 0, a step costs one dict read and one comparison per group.

Healthy look-alikes: warm-up from 0 (one step at 0), the last step of a cosine schedule at 0, and a
single group kept at lr 0 from the start while others train (a deliberate freeze).
The post-hook runs before the user's ``scheduler.step()``, so the lr read is the one the step used.
"""

from __future__ import annotations

from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import Check, StatusBoard, WatchedOptimizer

UPDATES = "optimizer_changes_params"


class ZeroLrCheck(Check):
    """Tracks, per param group, whether lr was ever positive and since when it has been 0."""

    names = (UPDATES,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer) -> None:
        self._board = board
        self._needed = config.zero_lr_steps
        self._watched = watched
        self._source = ("learning rate", watched.index)
        self._was_positive: list[bool] = []
        self._zero_since: list[tuple[int, int] | None] = []  # (optimizer step index, reported step)
        self._violated = False
        self._quiet = False  # every group has been positive and none is at 0

    def after_step(self, index: int, step: int) -> None:
        groups = self._watched.optimizer.param_groups
        if self._quiet and len(groups) == len(self._was_positive):
            for group in groups:
                lr = group.get("lr")
                if not (isinstance(lr, float | int) and lr > 0):
                    break
            else:
                return
        self._evaluate(index, step, groups)

    def _evaluate(self, index: int, step: int, groups: list[dict]) -> None:
        while len(self._was_positive) < len(groups):
            self._was_positive.append(False)
            self._zero_since.append(None)
        stuck: list[int] = []
        zero_groups = 0
        for g in range(len(groups)):
            lr = self._watched.lr(g)
            if lr is None or lr != 0:
                if lr is not None and lr > 0:
                    self._was_positive[g] = True
                self._zero_since[g] = None
                continue
            zero_groups += 1
            if self._zero_since[g] is None:
                self._zero_since[g] = (index, step)
            if index - self._zero_since[g][0] + 1 >= self._needed:
                stuck.append(g)
        decayed = [g for g in stuck if self._was_positive[g]]
        self._quiet = zero_groups == 0 and all(self._was_positive) and not self._violated
        opt = self._watched.index
        if decayed:
            first = min(self._zero_since[g][1] for g in decayed)
            message = (f"optimizer {opt}: learning rate of param group(s) {decayed} reached 0 at step {first} "
                       f"and has stayed 0 for {index - min(self._zero_since[g][0] for g in decayed) + 1} steps "
                       "while training continues: step() changes nothing")
            details = {"optimizer": opt, "groups": decayed, "lr_zero_since_step": first,
                       "likely_causes": ["a schedule that decays to 0 before the last step (total steps "
                                         "too small, scheduler stepped per batch instead of per epoch)",
                                         "a multiplicative lr drop with factor 0"]}
            self._flag(step, message, details, ("decayed", tuple(decayed)))
        elif zero_groups == len(groups) and len(stuck) == len(groups) and not any(self._was_positive):
            message = (f"optimizer {opt}: learning rate is 0 in every param group since its first step "
                       f"({index + 1} steps): step() changes nothing")
            details = {"optimizer": opt, "groups": list(range(len(groups))),
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
