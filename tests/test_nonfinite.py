"""Where a NaN came from, what the step does about it, and the repro bundle: real CPU training.

The fault scripts (tests/faults/fault_nonfinite_*.py, fault_ddp_nonfinite.py) run in the fault
suite with the model given (``test_faults.py`` checks their origins); here they run again without
the model (found from the optimizer, as ``tuimon run`` finds it), once under ``tuimon run``, and
the policies and the re-run's promises (nothing it touches changes) are checked on small loops.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.cli import TUIMON, tuimon_run_command
from helpers.recordings import of_type, read_messages, wait_until_recorded
from torch import nn

from publisher import repro
from publisher.monitor import Monitor
from publisher.nonfinite.guard import NonFiniteStop

FAULTS = Path(__file__).resolve().parent / "faults"
sys.path.insert(0, str(FAULTS))

import _harness as h  # noqa: E402  (the scripts import it by this name too)


def _origins(recording: h.Recording) -> list[dict[str, Any]]:
    return recording.events("nonfinite_origin")


def _origin_events(recording: Path) -> list[dict[str, Any]]:
    return [e for e in of_type(read_messages(recording), "event") if e["kind"] == "nonfinite_origin"]


def _run(name: str, tmp_path: Path, model_known: bool = True) -> h.Recording:
    [recording] = h.run_case(h._load(name), model_known=model_known, record_dir=tmp_path)
    return recording


@pytest.mark.parametrize(("name", "module", "cls", "phase"), [
    ("fault_nonfinite_forward", "Net.attn", "NeighbourAttention", "forward"),
    ("fault_nonfinite_backward", "Net.scale", "RowScale", "backward"),
])
def test_the_module_that_produced_the_first_nan_is_named_without_the_model_given(
        tmp_path: Path, name: str, module: str, cls: str, phase: str) -> None:
    recording = _run(name, tmp_path, model_known=False)
    [event] = _origins(recording)
    origin = event["details"]["origin"]
    assert (origin["module"], origin["class"], origin["phase"]) == (module, cls, phase)
    assert origin["reproduced"] is True and origin["inputs_finite"] is True
    assert event["step"] == h._load(name).first_faulty_step
    assert f"{phase} of {module}" in event["message"] and "reproduces" in event["message"]


def test_a_one_off_glitch_is_not_reproduced_and_skip_keeps_training_finite(tmp_path: Path) -> None:
    recording = _run("fault_nonfinite_glitch", tmp_path)
    [event] = _origins(recording)
    origin = event["details"]["origin"]
    assert origin["reproduced"] is False and origin["module"] is None and origin["phase"] == "forward"
    assert "not the code" in event["message"] and "node's health" in event["message"]
    assert "update is skipped" in event["message"]
    after = [m["metrics"] for m in recording.metrics() if m["step"] > event["step"]]
    assert after and all(math.isfinite(m["loss"]) for m in after), "the poisoned update was dropped"
    assert after[-1]["nonfinite_skipped"] == 1


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (BatchNorm's statistics took the NaN batch in)."""
    return torch.equal(a, b) or (a.is_floating_point()
                                 and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))


def _adam_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def test_skip_leaves_parameters_and_optimizer_state_bit_identical(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    monitor = Monitor(model, optimizer, record=tmp_path / "run.jsonl", gpu="none", on_nonfinite="skip")
    try:
        for _ in range(3):
            _adam_step(model, optimizer, torch.randn(16, 4))
            monitor.step(None)
        params = [p.detach().clone() for p in model.parameters()]
        state = {k: v.clone() for s in optimizer.state.values() for k, v in s.items()}
        buffers = [b.clone() for b in model.buffers()]
        optimizer.zero_grad()
        x = torch.randn(16, 4)
        x[3, 1] = float("nan")
        model(x).pow(2).mean().backward()
        grads = [p.grad for p in model.parameters()]
        rng = torch.get_rng_state()
        buffers_after_forward = [b.clone() for b in model.buffers()]
        optimizer.step()  # the pre-hook re-runs the step, then the update is dropped
        assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True))
        after = {k: v for s in optimizer.state.values() for k, v in s.items()}
        assert all(torch.equal(state[k], after[k]) for k in state), "no optimizer state moved"
        assert [p.grad for p in model.parameters()] == grads, "the gradients are put back for the caller"
        assert torch.equal(rng, torch.get_rng_state()), "the re-run put the RNG back"
        assert all(_same(a, b) for a, b in zip(buffers_after_forward, model.buffers(), strict=True)), \
            "the re-run put BatchNorm's statistics back"
        assert not all(_same(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
        monitor.step(None)
    finally:
        monitor.close()
    [event] = _origin_events(tmp_path / "run.jsonl")
    origin = event["details"]["origin"]
    assert (origin["module"], origin["inputs_finite"], origin["reproduced"]) == ("input", False, True)
    assert "the batch holds NaN" in event["message"]


def test_stop_raises_after_the_bundle_is_written_and_healthy_steps_leave_nothing(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model, optimizer, record=tmp_path / "run.jsonl", gpu="none", on_nonfinite="stop",
                      seed=1234, repro_weights=True)
    try:
        for _ in range(5):
            _adam_step(model, optimizer, torch.randn(8, 4))
            monitor.step(None)
        assert not list(tmp_path.glob("*.repro.zip")), "a healthy step writes nothing"
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        bad = torch.randn(8, 4)
        bad[0, 0] = float("nan")
        with pytest.raises(NonFiniteStop, match="step 6"):
            _adam_step(model, optimizer, bad)
    finally:
        monitor.close("failed")
    [bundle] = tmp_path.glob("*.repro.zip")
    assert bundle.name == "run.step6.repro.zip"
    case = repro.load(bundle)
    assert case.step == 6 and case.manifest["seed"] == 1234 and case.manifest["policy"] == "stop"
    args, kwargs = case.inputs()
    assert _same(args[0], bad) and kwargs == {}
    assert case.weights is not None and all(torch.equal(weights[k], v) for k, v in case.weights.items())
    model.load_state_dict(case.weights)
    case.restore_rng()
    assert not torch.isfinite(model(*args)).all(), "the bundle reproduces the step in a notebook"
    assert case.origin["module"] == "input" and case.origin["phase"] == "forward"
    shown = subprocess.run([*TUIMON, "repro", "show", str(bundle)], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "step 6" in shown.stdout and "the model's inputs (the batch) hold NaN or Inf" in shown.stdout
    assert "repro.load" in shown.stdout
    as_json = subprocess.run([*TUIMON, "repro", "show", str(bundle), "--json"], capture_output=True,
                             text=True, timeout=60)
    assert json.loads(as_json.stdout)["origin"]["reproduced"] is True
    refused = subprocess.run([*TUIMON, "repro", "show", str(tmp_path / "run.jsonl")], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "not a tuimon repro bundle" in refused.stderr


def test_an_unknown_model_is_said_and_not_guessed(tmp_path: Path) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(None, optimizer, record=tmp_path / "run.jsonl", gpu="none", stats=False) as monitor:
        x = torch.randn(8, 4)
        x[0, 0] = float("nan")
        _adam_step(model, optimizer, x)
        monitor.step(None)
    [event] = _origin_events(tmp_path / "run.jsonl")
    assert event["details"]["origin"]["rerun"] is False
    assert "could not re-run" in event["message"] and "model is unknown" in event["message"]


def test_tuimon_run_names_the_origin_of_an_unmodified_script(tmp_path: Path) -> None:
    script = FAULTS / "fault_nonfinite_forward.py"
    result, [recording] = tuimon_run_command(tmp_path, [sys.executable, str(script), "--plain"], run="nan",
                                             options=["--on-nonfinite", "skip"])
    assert result.returncode == 0, result.stderr
    messages = read_messages(recording)
    [event] = _origin_events(recording)
    origin = event["details"]["origin"]
    assert (origin["module"], origin["phase"], origin["reproduced"]) == ("Net.attn", "forward", True)
    bundle = Path(event["details"]["repro"])
    assert bundle.parent == recording.parent and bundle.exists(), "the bundle lies next to the recording"
    assert repro.load(bundle).manifest["loss"] is not None, "tuimon run knows the loss before the update"
    losses = [m["metrics"]["loss"] for m in of_type(messages, "metrics") if m["step"] > event["step"]]
    assert losses and all(math.isfinite(loss) for loss in losses), "skip kept the weights finite"


def test_a_loss_that_goes_non_finite_on_finite_outputs_is_told_apart_from_the_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, record=tmp_path / "run.jsonl", gpu="none") as monitor:
        x = torch.randn(8, 4)
        optimizer.zero_grad()
        (model(x) * 0).sqrt().mean().backward()  # sqrt'(0): a finite loss, an infinite derivative
        optimizer.step()
        monitor.step(None)
    [event] = _origin_events(tmp_path / "run.jsonl")
    origin = event["details"]["origin"]
    assert (origin["module"], origin["reproduced"]) == ("loss", None)
    assert "outside the model" in event["message"] and "loss function" in event["message"]


def test_with_gradient_accumulation_the_micro_batch_that_reproduces_is_the_one_named(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, record=tmp_path / "run.jsonl", gpu="none", on_nonfinite="skip") as monitor:
        optimizer.zero_grad()
        for micro in range(3):
            x = torch.randn(4, 4)
            if micro == 1:
                x[0, 0] = float("nan")
            model(x).pow(2).mean().backward()
        optimizer.step()
        monitor.step(None)
    [event] = _origin_events(tmp_path / "run.jsonl")
    origin = event["details"]["origin"]
    assert (origin["module"], origin["call"], origin["calls"]) == ("input", 1, 3)
    case = repro.load(event["details"]["repro"])
    assert not torch.isfinite(case.inputs()[0][0]).all(), "the bundle's inputs are the call that reproduced"


def _seeded_mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _poisoned_at(model: nn.Module, width: int, record: Path, poisoned: int, steps: int = 160) -> None:
    """Train ``model`` under ``report`` with a small gradient norm budget, a NaN in one input of step
    ``poisoned``; after step 20 wait until the step worker has timed the steps (the budget then
    spaces the norm out)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, record=record, gpu="none", stats=False, grad_norm_budget=0.002) as monitor:
        for step in range(1, steps):
            x = torch.randn(32, width)
            if step == poisoned:
                x[5, 7] = float("nan")
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
            if step == 20:
                wait_until_recorded(record, step=20)


@pytest.mark.parametrize("size", ["fast", "slow"])
def test_report_on_the_cpu_catches_a_nan_before_its_update_on_a_step_the_norm_budget_skipped(
        tmp_path: Path, size: str) -> None:
    """Under the default ``report`` on a CPU the gradient norm's budget measures few steps, but the
    loss, on the host at ``backward``, is read on every step: the first poisoned step is caught
    before its update, whichever step it is. Where a step takes 1.5 ms or more its model calls are
    kept on every step and it is re-run to the module; on faster steps the event says they were not."""
    torch.manual_seed(0)
    width, hidden = (64, 256) if size == "fast" else (512, 2048)
    model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    record = tmp_path / "run.jsonl"
    poisoned = 137
    _poisoned_at(model, width, record, poisoned)
    checked = ["grad_norm" in m["metrics"] for m in of_type(read_messages(record), "metrics")[20:130]]
    assert sum(checked) < 60, "the budget skips most steps' norms"
    [event] = _origin_events(record)
    assert event["step"] == poisoned
    if size == "slow":
        assert event["details"]["origin"]["module"] == "input", event["message"]
    else:
        assert "caught before its update" in event["message"] and "grad_norm_budget=1.0" in event["message"]


def test_a_diverging_run_is_caught_at_its_first_non_finite_gradients(tmp_path: Path) -> None:
    """A learning rate set 2,000x too high: the loss grows by orders of magnitude a step and the
    gradients overflow while the loss is still finite. The step whose gradients are first not finite
    is the one analysed, before its update, and the event says the run diverged, not which module."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(4096, 32)
    labels = inputs[:, :10].argmax(1)
    record = tmp_path / "run.jsonl"
    first_bad = None
    finite_weights = []  # before each update
    with Monitor(model, optimizer, record=record, gpu="none") as monitor:
        for step in range(1, 200):
            if step == 151:
                for group in optimizer.param_groups:
                    group["lr"] *= 2000
            rows = torch.randint(0, 4096, (64,))
            loss = nn.functional.cross_entropy(model(inputs[rows]), labels[rows])
            optimizer.zero_grad()
            loss.backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            if first_bad is None and not torch.isfinite(norm):  # overflowed, or NaN/Inf in a gradient
                first_bad = step
            finite_weights.append(all(bool(torch.isfinite(p).all()) for p in model.parameters()))
            optimizer.step()
            monitor.step(loss)
    assert first_bad is not None
    [event] = _origin_events(record)
    assert event["step"] == first_bad and finite_weights[first_bad - 1], "caught before the update"
    assert "diverged" in event["message"] and "learning rate" in event["message"]
    assert event["details"]["diverging"]["from_step"] > 151


