"""Whole training loops, generated: Hypothesis builds small real loops from odd ingredients and
shrinks a failing one to the fewest (``tests/helpers/loops.py``).

Each loop runs under an embedded Monitor, and a few under `tuimon run`. Whatever the mix, a user
must find every optimizer step's metrics, each NaN loss named by ``nonfinite_loss`` within a step,
no failure of monitoring on a valid loop, and nothing raised into training. ``make test`` runs a
bounded, seeded profile (``ci``); ``benchmarks/generated_loops.py`` runs the long one
(``TUIMON_LOOPS_PROFILE=long``). A loop it found failing stays below as a plain regression test.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
from helpers.cli import SCRIPTS, tuimon_run_command
from helpers.loops import BATCHES, DTYPES, EXTRAS, LOSS_AS, LOSSES, MODELS, LoopRecipe, train
from helpers.recordings import of_type, read_messages
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from publisher.monitor import Monitor
from publisher.wire.protocol import read_number

settings.register_profile("ci", max_examples=8, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=int(os.environ.get("TUIMON_LOOPS_EXAMPLES", "400")),
                          deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("TUIMON_LOOPS_PROFILE", "ci")


@st.composite
def recipes(draw: st.DrawFn) -> LoopRecipe:
    iterations = draw(st.integers(12, 40))
    return LoopRecipe(
        model=draw(st.sampled_from(MODELS)),
        dtype=draw(st.sampled_from(DTYPES)),
        loss=draw(st.sampled_from(LOSSES)),
        loss_as=draw(st.sampled_from(LOSS_AS)),
        batch=draw(st.sampled_from(BATCHES)),
        backwards=draw(st.integers(1, 3)),
        skip_every=draw(st.sampled_from((0, 0, 3, 5))),
        evaluate_every=draw(st.sampled_from((0, 0, 4))),
        nan_at=tuple(sorted(draw(st.sets(st.integers(1, iterations), max_size=2)))),
        extras=tuple(draw(st.lists(st.sampled_from(EXTRAS), unique=True, max_size=3))),
        iterations=iterations,
        batch_size=draw(st.sampled_from((1, 2, 6, 16))),
        loader=draw(st.booleans()),
        strided=draw(st.booleans()),
    )


def _check(messages: list[dict[str, Any]], losses: list[float]) -> None:
    """What a user must find in the recording of a loop whose optimizer steps had ``losses``."""
    metrics = of_type(messages, "metrics")
    assert [m["step"] for m in metrics] == list(range(1, len(losses) + 1)), "an optimizer step is missing"
    events = of_type(messages, "event")
    failures = [e["message"] for e in events if e["kind"] == "telemetry_error"]
    assert not failures, failures
    assert not [m["failed"] for m in metrics if m.get("failed")]
    named = {step for e in events if e["kind"] == "nonfinite_loss"
             for step in range(e["step"], e["details"].get("last_step", e["step"]) + 1)}
    first_nan = next((step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)), None)
    if first_nan is not None:
        assert first_nan in named, f"the NaN loss of step {first_nan} is not named"
    reported = {m["step"]: read_number(m["metrics"]["loss"]) for m in metrics if "loss" in m["metrics"]}
    for step, loss in enumerate(losses, 1):
        if step in reported and math.isfinite(loss):
            assert math.isclose(reported[step], loss, rel_tol=1e-3, abs_tol=1e-3), (step, loss)


@settings(settings.get_profile(PROFILE))
@given(recipe=recipes())
def test_a_generated_loop_loses_no_step_and_names_its_nans(recipe: LoopRecipe, tmp_path_factory: Any) -> None:
    record = tmp_path_factory.mktemp("loop") / "run.jsonl"
    monitors: list[Monitor] = []

    def watch(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Monitor:
        monitors.append(Monitor(model, optimizer, run="generated", record=record, gpu="none"))
        return monitors[0]

    try:
        losses = train(recipe, watch)
    finally:
        for monitor in monitors:
            monitor.close()
    _check(read_messages(record), losses)


def test_a_generated_loop_from_the_strategys_corners_under_tuimon_run(tmp_path: Path) -> None:
    """A recipe of the strategy's odd corners, unmodified, under `tuimon run`: gradient checkpointing,
    a masked loss, accumulation, skipped steps, evaluations, a DataLoader of strings and None."""
    for index, recipe in enumerate((
        LoopRecipe(model="checkpointed", loss="masked", loss_as="float", batch="with_strings", backwards=2,
                   skip_every=3, evaluate_every=4, nan_at=(9,), batch_size=2, iterations=30, loader=True,
                   strided=True),
    )):
        result, recordings = tuimon_run_command(tmp_path / str(index), [
            sys.executable, str(SCRIPTS / "plain_recipe_loop.py"), recipe.to_json()], f"generated-{index}")
        assert result.returncode == 0, result.stderr[-2000:]
        losses = json.loads(result.stdout.strip().splitlines()[-1])
        messages = read_messages(recordings[0])
        assert len(of_type(messages, "metrics")) == len(losses)
        if any(not math.isfinite(loss) for loss in losses):
            assert any(e["kind"] == "nonfinite_loss" for e in of_type(messages, "event"))
        assert not [e for e in of_type(messages, "event") if e["kind"] == "telemetry_error"]
