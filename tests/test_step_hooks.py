"""The optimizers' shared step hooks (publisher/measure/step_hooks.py), on real optimizers and steps.

One pre-hook and one post-hook per optimizer call tuimon's parts only on the steps each asked for,
count the outermost steps once (a subclass calling ``super().step()`` too), and leave the optimizer
as it was once the last part is gone.
"""

from __future__ import annotations

import pytest
import torch

from publisher.measure.step_hooks import NEVER, hooks_on


class Recorder:
    """A part that records the steps it was called on and asks for the next one ``every`` steps."""

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.before: list[int] = []
        self.after: list[int] = []

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> None:
        self.before.append(index)

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> int:
        self.after.append(index)
        return index + self.every if self.every else NEVER


def _train(optimizer: torch.optim.Optimizer, weight: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        (weight * 2.0).sum().backward()
        optimizer.step()


def test_each_part_is_called_on_the_steps_it_asked_for_and_the_count_is_every_step() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    hooks = hooks_on(optimizer)
    every_step, every_fifth, once = Recorder(1), Recorder(5), Recorder(0)
    for part in (every_step, every_fifth, once):
        hooks.add(part)
    _train(optimizer, weight, 12)
    assert hooks.count == 12
    assert every_step.before == every_step.after == list(range(12))
    assert every_fifth.before == every_fifth.after == [0, 5, 10]
    assert once.before == once.after == [0]
    hooks.wake(once)  # something it waits for came from outside: called from the next step on
    hooks.call_at(every_fifth, 14)
    _train(optimizer, weight, 3)
    assert once.after == [0, 12]
    assert every_fifth.after == [0, 5, 10, 14]
    for part in (every_step, every_fifth, once):
        hooks.remove(part)


def test_a_subclass_calling_super_step_is_one_step() -> None:
    class Nested(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[override]
            return super().step(closure)

    torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1).step()  # the base class's hooks wrap too
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = Nested([weight], lr=0.1)
    part = Recorder(1)
    hooks_on(optimizer).add(part)
    _train(optimizer, weight, 4)
    assert hooks_on(optimizer).count == 4
    assert part.before == part.after == [0, 1, 2, 3]
    hooks_on(optimizer).remove(part)


def test_a_step_that_raised_is_not_counted_and_the_next_one_is_called_whole() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    part = Recorder(1)
    hooks = hooks_on(optimizer)
    hooks.add(part)
    _train(optimizer, weight, 2)

    def failing_closure() -> torch.Tensor:
        raise RuntimeError("the loss could not be computed")

    with pytest.raises(RuntimeError, match="could not be computed"):
        optimizer.step(failing_closure)
    _train(optimizer, weight, 2)
    # The failed step ran its part before the update only; the steps after it are whole, in order.
    assert part.before == [0, 1, 2, 2, 3]
    assert part.after == [0, 1, 2, 3]
    assert hooks.count == 4
    hooks.remove(part)


def test_the_last_part_gone_leaves_the_optimizer_without_tuimon_hooks() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([weight], lr=0.1)
    first, second = Recorder(), Recorder()
    hooks = hooks_on(optimizer)
    hooks.add(first)
    hooks.add(second)
    assert len(optimizer._optimizer_step_pre_hooks) == len(optimizer._optimizer_step_post_hooks) == 1
    hooks.remove(first)
    assert hooks_on(optimizer) is hooks
    hooks.remove(second)
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    fresh = hooks_on(optimizer)  # a later Monitor on the same optimizer counts from its own start
    assert fresh is not hooks and fresh.count == 0
    fresh.add(first)
    _train(optimizer, weight, 1)
    assert fresh.count == 1
    fresh.remove(first)


def test_an_optimizer_class_that_does_not_hash_still_gets_hooks() -> None:
    class Unhashable(torch.optim.SGD):
        def __eq__(self, other: object) -> bool:
            return self is other

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = Unhashable([weight], lr=0.1)
    part = Recorder(2)
    hooks_on(optimizer).add(part)
    _train(optimizer, weight, 5)
    assert part.after == [0, 2, 4]
    hooks_on(optimizer).remove(part)
