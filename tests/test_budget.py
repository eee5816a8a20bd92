"""Cost budgets: the costlier measurements space themselves out to keep to their share of a step."""

from __future__ import annotations

import itertools

import pytest
import torch

from publisher.measure.budget import CostBudget, Schedule, StepClock
from publisher.stats.grad_norm import BudgetedGradNorm


def test_a_measurement_within_its_budget_keeps_its_period_and_a_costly_one_is_spaced_out() -> None:
    budget = CostBudget(0.01, every=10, cold=0)
    budget.charge(50e-6)  # 50 us against 1 % of a 1 ms step: 5 steps' worth, fits in every 10
    assert budget.gap(1e-3) == 10
    costly = CostBudget(0.01, every=10, cold=0)
    costly.charge(400e-6)  # 40 steps' worth of budget
    assert costly.gap(1e-3) == 40
    assert costly.gap(20e-3) == 10, "the same cost on 20 ms steps fits"
    assert costly.gap(None) == 10, "step time unknown: the period stands"


def test_the_first_charges_are_set_up_and_the_period_is_bounded() -> None:
    budget = CostBudget(0.01, every=10, longest=100, cold=1)
    budget.charge(1.0)  # the first run pays one-off set-up: ignored
    assert budget.gap(1e-3) == 10
    budget.charge(1.0)  # a second far over budget: 1000 steps' worth, bounded
    assert budget.gap(1e-3) == 100
    unlimited = CostBudget(1.0, every=3, cold=0)
    unlimited.charge(1.0)
    assert unlimited.gap(1e-3) == 3, "a share of 1.0 turns the budget off"


def test_long_steps_shorten_the_period_to_keep_within_its_seconds() -> None:
    budget = CostBudget(0.01, every=10, longest=100, within_s=0.5, cold=0)
    budget.charge(50e-6)
    assert budget.gap(10e-3) == 10, "10 steps of 10 ms fit in half a second"
    assert budget.gap(0.1) == 5, "10 steps of 100 ms would be a second late"
    assert budget.gap(2.0) == 1, "a step longer than the bound: every step"


def test_one_slow_run_moves_the_period_for_a_few_runs_only() -> None:
    budget = CostBudget(0.01, every=1, cold=0)
    for _ in range(20):
        budget.charge(100e-6)
    assert budget.gap(1e-3) == 10
    budget.charge(1e-3)  # one run 10x slower (a page fault, a busy core)
    assert 10 < budget.gap(1e-3) < 100, "averaged, not taken as the new cost"
    for _ in range(10):
        budget.charge(100e-6)
    assert budget.gap(1e-3) <= 12


def test_a_run_paused_a_thousand_fold_spaces_the_next_runs_by_less_than_twice() -> None:
    """A run that a busy core descheduled (or a garbage collection paused) does not silence the
    measurement for thousands of steps; a cost that rose for good is followed within a few runs."""
    budget = CostBudget(0.01, every=1, cold=0)
    for _ in range(20):
        budget.charge(100e-6)
    budget.charge(0.1)  # 1000x the usual 100 us
    assert budget.gap(1e-3) < 20
    for _ in range(12):
        budget.charge(1e-3)  # the measurement costs 10x more from now on
    assert budget.gap(1e-3) >= 90


@pytest.mark.parametrize("share", [0, -0.1, 1.5, "1", True])
def test_a_share_outside_0_to_1_is_refused_with_its_name(share: object) -> None:
    with pytest.raises(ValueError, match="grad_norm_budget must be a share of the step time"):
        CostBudget(share, what="grad_norm_budget")  # type: ignore[arg-type]


def test_the_typical_step_ignores_pauses_and_follows_a_lasting_change() -> None:
    clock = StepClock()
    assert clock.seconds is None
    for step in range(200):
        clock.observe(0.5 if step % 10 == 9 else 0.001)  # an evaluation pause every 10 steps
    assert clock.seconds == pytest.approx(0.001)
    for _ in range(40):
        clock.observe(0.002)  # the steps got slower for good (a longer sequence length)
    assert clock.seconds == pytest.approx(0.002)


def test_retiming_a_schedule_keeps_the_step_already_planned() -> None:
    schedule = Schedule(dense=3, every=10)
    assert [i for i in range(25) if schedule.due(i)] == [0, 1, 2, 10, 20]
    schedule.retime(25, index=11)  # decided after step 10: step 20 may already be armed
    assert [i for i in range(11, 80) if schedule.due(i)] == [20, 45, 70]
    assert schedule.next_due(21) == 45
    schedule.request(50)  # a check asking to confirm a suspicion on the next step
    assert [i for i in range(40, 80) if schedule.due(i)] == [45, 50, 70]


def _steps_between_norms(step_cost: float) -> int:
    """Steps a 0.5 % gradient-norm budget leaves between two norms on 1 ms steps, when recording
    each norm's step costs ``step_cost`` seconds more than a step without it."""
    clock = StepClock()
    for _ in range(StepClock.WINDOW):
        clock.observe(1e-3)
    norm = BudgetedGradNorm(0.005, clock)
    weight = torch.nn.Parameter(torch.ones(8))
    weight.grad = torch.ones(8)
    steps = itertools.count()
    for _ in range(2):  # the first computation pays the set-up and is not charged
        while norm.due(lambda: [weight], float(next(steps))) is None:
            pass
        norm.settle(step_cost)
    return norm.idle_steps()


def test_a_gradient_norm_is_charged_the_full_step_that_carried_it() -> None:
    """A step carrying the norm cannot take the Monitor's quiet path; that cost is the norm's too."""
    alone = _steps_between_norms(0.0)
    assert alone < 10_000, "8 numbers cost far less than 50 ms (10,000 steps' worth of 5 us)"
    assert _steps_between_norms(0.1) >= 19_999, "0.1 s more per norm is 20,000 steps' worth of its share"
