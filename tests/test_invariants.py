"""Training invariants on real CPU training loops (single process).

The fault and healthy scripts live in tests/faults/ (each also runs standalone). test_faults.py
runs every one with the model given (as ``Monitor(model=...)``); here the single-process ones run
again without it (zero-code mode: the model is discovered at a forward). Further tests pin down the
checker's contract with the Monitor.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers.fault_batches import FAULTS, h, run_batches
from helpers.recordings import of_type, read_messages
from torch import nn

from publisher.invariants import INVARIANT_NAMES, InvariantChecker, InvariantConfig
from publisher.measure.budget import StepClock
from publisher.monitor import Monitor
from publisher.wire.event_kinds import EVENT_KINDS


def _cases(prefix: str) -> list[h.Case]:
    """The single-process scripts: not those that measure the process's memory (``own_process``),
    which test_faults runs each in a process of its own."""
    modules = sorted(p.stem for p in FAULTS.glob(f"{prefix}_*.py"))
    cases = [importlib.import_module(name).CASE for name in modules]
    return [case for case in cases if case.world_size == 1 and not case.own_process]


FAULT_CASES, HEALTHY_CASES = _cases("fault"), _cases("healthy")


@pytest.fixture(scope="module")
def without_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every one of them run once without the model given, in subprocesses; their recordings' folder."""
    names = [case.name for case in FAULT_CASES + HEALTHY_CASES]
    return run_batches(tmp_path_factory.mktemp("no-model"), names, "--no-model", timeout=170)


@pytest.mark.parametrize("case", FAULT_CASES, ids=lambda case: case.name)
def test_fault_is_detected_soon_after_its_trigger_without_the_model(case: h.Case,
                                                                   without_model: Path) -> None:
    recordings = h.recordings_of(case.name, 1, without_model)
    verdict = h.judge(case, recordings)
    assert verdict.passed, verdict.problems
    for kind in case.expect:
        event = next(e for e in recordings[0].events(kind))
        assert event["severity"] == EVENT_KINDS[kind].default_severity
        assert event["message"] and isinstance(event["details"], dict)


@pytest.mark.parametrize("case", HEALTHY_CASES, ids=lambda case: case.name)
def test_healthy_run_raises_no_alarm_without_the_model(case: h.Case, without_model: Path) -> None:
    recordings = h.recordings_of(case.name, 1, without_model)
    verdict = h.judge(case, recordings)
    assert verdict.passed, verdict.problems
    final = h.final_statuses(recordings[0])
    assert not [name for name, state in final.items() if state["status"] == "violated"]
    # The healthy suite must also have checked something, not only stayed quiet.
    assert final["params_receive_grads"]["status"] == "ok"


def _load(name: str) -> h.Case:
    return importlib.import_module(name).CASE


def test_events_name_the_culprits() -> None:
    [detached] = h.run_case(_load("fault_detached_subgraph"))
    [event] = detached.events("missing_gradient")
    assert sorted(event["details"]["params"]) == sorted(
        ["branch_b.0.weight", "branch_b.0.bias", "branch_b.2.weight", "branch_b.2.bias"])
    [frozen] = h.run_case(_load("fault_frozen_optimizer"))
    [unowned] = frozen.events("unowned_parameters")
    assert unowned["severity"] == "info"
    assert unowned["details"]["params"] == ["head.weight", "head.bias"]
    [lr] = h.run_case(_load("fault_lr_decay_to_zero"))
    [event] = lr.events("optimizer_noop")
    assert event["details"]["lr_zero_since_step"] == 10


def test_tensors_outside_the_model_are_named_and_those_said_to_be_deliberate_are_not() -> None:
    """The loss's graph reaches a weight made in the script and a hand-optimised input offset; the
    optimizer knows neither. Named by the variables holding them; the batch itself, made a leaf
    that requires grad every step (adversarial training), is a new tensor each time and is not
    one of them; a tensor the user says to ignore is not reported."""
    model = h.mlp((8, 16, 1))
    scale = torch.ones(1, requires_grad=True)
    offset = torch.zeros(1, 8, requires_grad=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def train(ignored: list[torch.Tensor]) -> list[dict]:
        recording, checker = _record([optimizer], model)
        checker.ignore_unowned(ignored)
        for _, (x, y) in h.batches(8):
            x = x.clone().requires_grad_(True)
            loss = nn.functional.mse_loss(model(x + offset) * scale, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            checker.offer_graph(loss)
        checker.close()
        return recording.events("unowned_tensors")

    [event] = train(ignored=[])
    assert event["severity"] == "warning" and event["step"] == 4, "at the first ownership check"
    tensors = sorted((t["name"].split(" (")[0], t["shape"]) for t in event["details"]["tensors"])
    assert tensors == [("offset in train()", [1, 8]), ("scale in train()", [1])]
    assert "2 tensors outside the model" in event["message"]
    [only_scale] = train(ignored=[offset])
    assert [t["shape"] for t in only_scale["details"]["tensors"]] == [[1]]
    assert train(ignored=[offset, scale]) == []


def test_without_a_model_parameters_are_named_after_the_modules_found() -> None:
    model = h.mlp()
    model[2].requires_grad_(True)
    recording = h.Recording()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checker = InvariantChecker([optimizer], None, emit_violation=recording.emit_violation,
                               emit_status=recording.emit_status)
    cut = lambda x: model[2](model[1](model[0](x)).detach())  # noqa: E731  (first layer cut off)
    for _, batch in h.batches(8):
        h.train_step(cut, optimizer, batch)
    checker.close()
    [event] = recording.events("missing_gradient")
    # No module holds the whole model: each layer called on its own is found as a root.
    assert event["details"]["params"] == ["Linear.weight", "Linear.bias"]


def _record(optimizers, model, config=None):
    recording = h.Recording()
    checker = InvariantChecker(optimizers, model, emit_violation=recording.emit_violation,
                               emit_status=recording.emit_status, config=config)
    return recording, checker


def test_every_invariant_starts_unchecked_and_statuses_are_published_only_on_change() -> None:
    model = h.mlp((8, 32, 1), dropout=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    recording, checker = _record([optimizer], model)
    start = list(recording.messages)
    assert [m["name"] for m in start] == list(INVARIANT_NAMES)
    assert {m["status"] for m in start} == {"unchecked"}
    for _, batch in h.batches(60):
        h.train_step(model, optimizer, batch)
    checker.close()
    for name in INVARIANT_NAMES:
        statuses = [m["status"] for m in recording.statuses(name)]
        assert all(a != b for a, b in itertools.pairwise(statuses)), (name, statuses)
    current = checker.statuses()
    assert set(current) == set(INVARIANT_NAMES)
    assert current["optimizer_changes_params"]["status"] == "ok"
    assert current["optimizer_changes_params"]["step"] >= 50  # last checked step, not the first
    replicas = current["replicas_consistent"]
    assert replicas["status"] == "unchecked" and "single process" in replicas["message"]


def test_one_event_per_episode_and_a_new_episode_after_recovery() -> None:
    model = h.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    recording, checker = _record([optimizer], model)
    forgets = set(range(6, 30)) | set(range(45, 60))
    for step, batch in h.batches(70):
        if step not in forgets:
            optimizer.zero_grad()
        h.backward(model, batch)
        optimizer.step()
    checker.close()
    steps = [e["step"] for e in recording.events("stale_gradients")]
    assert len(steps) == 2, steps
    assert 6 <= steps[0] <= 11 and 45 <= steps[1] <= 51
    assert [m["status"] for m in recording.statuses("grads_cleared")] == [
        "unchecked", "ok", "violated", "ok", "violated", "ok"]


def test_close_removes_every_hook_and_stops_reporting() -> None:
    model = h.mlp((8, 32, 1), dropout=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    recording, checker = _record([optimizer], None)  # no model: the global discovery hook too
    for _, batch in h.batches(7):
        h.train_step(model, optimizer, batch)
    checker.close()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    assert all(not p._backward_hooks for p in model.parameters())
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert not nn.modules.module._global_forward_pre_hooks
    before = len(recording.messages)
    for step, batch in h.batches(20):
        if step % 2:
            optimizer.zero_grad()  # would be stale gradients
        h.backward(model, batch)
        optimizer.step()
    assert len(recording.messages) == before


def test_optimizer_added_later_is_watched_and_the_model_found_at_a_forward() -> None:
    """Zero-code mode: created with no optimizer and no model, optimizers added as they appear."""
    generator = h.mlp((4, 16, 2), seed=1)
    discriminator = h.mlp((2, 16, 16, 1), dropout=0.2, seed=2)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    recording, checker = _record([], None)
    bce = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(0)
    for step in range(30):
        if step == 0:
            checker.add_optimizer(opt_d)
        if step == 12:
            discriminator.eval()  # left in eval mode: found only through the discovered root
        fake = generator(torch.randn(16, 4, generator=g))
        opt_d.zero_grad()
        real_score = discriminator(torch.randn(16, 2, generator=g))
        fake_score = discriminator(fake.detach())
        d_loss = bce(real_score, torch.ones_like(real_score)) + bce(fake_score, torch.zeros_like(fake_score))
        d_loss.backward()
        opt_d.step()
        if step == 0:
            checker.add_optimizer(opt_g)
            checker.add_optimizer(opt_g)  # twice is harmless
        opt_g.zero_grad()
        fake_score = discriminator(fake)
        bce(fake_score, torch.ones_like(fake_score)).backward()
        opt_g.step()
    checker.close()
    assert [e["kind"] for e in recording.alarms()] == ["eval_mode_training"]
    assert 12 <= recording.alarms()[0]["step"] <= 12 + 11
    assert checker.statuses()["optimizer_owns_trainables"]["status"] == "ok"


def test_disabled_invariants_stay_unchecked_and_silent() -> None:
    config = InvariantConfig(disabled=frozenset({"grads_cleared"}))
    model = h.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    recording, checker = _record([optimizer], model, config)
    for _, batch in h.batches(20):
        h.backward(model, batch)  # zero_grad never called
        optimizer.step()
    checker.close()
    assert not recording.events("stale_gradients")
    status = checker.statuses()["grads_cleared"]
    assert status["status"] == "unchecked" and "disabled" in status["message"]


@pytest.mark.parametrize("bad", [{"grad_window": 0}, {"check_every": 2.5}, {"replica_rtol": -1.0},
                                 {"disabled": frozenset({"no_such_invariant"})}])
def test_bad_configuration_is_refused_with_a_clear_error(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad)) if "disabled" not in bad else "unknown invariants"):
        InvariantConfig(**bad)


def test_a_check_that_breaks_is_switched_off_and_training_goes_on(caplog) -> None:
    """A dry run on the meta device: values cannot be read back, training must still run."""
    model = nn.Linear(4, 2, device="meta")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _, checker = _record([optimizer], model)
    for _ in range(8):
        optimizer.zero_grad()
        model(torch.randn(3, 4, device="meta")).sum().backward()
        optimizer.step()
    checker.close()
    broken = checker.statuses()["params_receive_grads"]
    assert broken["status"] == "unchecked" and "internal error" in broken["message"]
    assert checker.statuses()["grads_cleared"]["status"] == "ok"  # the other checks carry on
    assert "switched off" in caplog.text


def test_an_emitter_that_raises_never_breaks_the_training_step(caplog) -> None:
    def refuse(*args) -> None:
        raise RuntimeError("publisher queue closed")

    model = h.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    checker = InvariantChecker([optimizer], model, emit_violation=refuse, emit_status=refuse)
    for _, batch in h.batches(15):
        h.backward(model, batch)  # no zero_grad: a violation to emit
        optimizer.step()
    checker.close()
    assert checker.statuses()["grads_cleared"]["status"] == "violated"
    assert "publisher queue closed" in caplog.text


def test_a_subclass_calling_super_step_and_a_step_that_raised_count_as_one_step_each() -> None:
    """torch fires the step hooks twice for ``super().step()`` once the base class was used."""

    class Flaky(torch.optim.SGD):
        fail = False

        def step(self, closure=None):
            if self.fail:
                raise RuntimeError("out of memory (simulated by the training code)")
            return super().step(closure)

    torch.optim.SGD(h.mlp().parameters(), lr=0.1)  # the base class's step is now hooked as well
    model = h.mlp()
    optimizer = Flaky(model.parameters(), lr=0.02)
    recording, checker = _record([optimizer], model)
    for step, batch in h.batches(24):
        if step < 12:
            optimizer.zero_grad()
        h.backward(model, batch)
        optimizer.fail = step == 4
        with contextlib.suppress(RuntimeError):  # the loop skips the failed step, as OOM-tolerant loops do
            optimizer.step()
    checker.close()
    [stale] = recording.events("stale_gradients")
    # Counted once per call: the 13th counted step is index 11, sampled at 20 (double counting
    # would report about 40).
    assert 11 <= stale["step"] <= 22
    assert checker.statuses()["optimizer_changes_params"]["step"] <= 22


@pytest.mark.parametrize("kind", ["eval_mode_training", "optimizer_noop"])
def test_checks_spaced_out_by_their_budget_still_catch_a_fault_within_max_check_every(kind: str) -> None:
    model = h.mlp((8, 32, 32, 1), dropout=0.2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    clock = StepClock()
    clock.observe(1e-7)  # steps of 0.1 us: every check costs far more than its budget
    config = InvariantConfig(check_every=10, max_check_every=30)
    recording = h.Recording()
    checker = InvariantChecker([optimizer], model, emit_violation=recording.emit_violation,
                               emit_status=recording.emit_status, config=config, step_clock=clock)
    trigger = 150
    for step, batch in h.batches(260):
        if step == trigger and kind == "eval_mode_training":
            model.eval()
        if step == trigger and kind == "optimizer_noop":  # the optimizer now holds copies: no gradients
            optimizer.param_groups[0]["params"] = [p.detach().clone().requires_grad_()
                                                   for p in model.parameters()]
        h.train_step(model, optimizer, batch)
    checker.close()
    [event] = recording.events(kind)
    assert trigger <= event["step"] <= trigger + 30 + 1, "one period plus the confirming step at most"


# --------------------------------------------------------------------------- ties_hold

VOCAB, DIM = 50, 16


class _TinyLM(nn.Module):
    """Embedding 50x16, a mixing layer, a linear head 16->50 whose weight is the embedding's when tied."""

    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def _tokens(steps: int):
    g = torch.Generator().manual_seed(4)
    for step in range(steps):
        yield step, torch.randint(0, VOCAB, (8, 12), generator=g)


def _lm_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    optimizer.zero_grad()
    logits = model(tokens[:, :-1])
    nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
    optimizer.step()


def _loaded_on_meta() -> _TinyLM:
    """The tied model saved as separate copies, rebuilt on the meta device, loaded with assign=True."""
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in _TinyLM().state_dict().items()}
    with torch.device("meta"):
        model = _TinyLM()
    model.load_state_dict(state, assign=True)
    assert model.head.weight is not model.embed.weight and torch.equal(model.head.weight, model.embed.weight)
    return model


@pytest.mark.parametrize("model_known", [True, False], ids=["model", "no-model"])
@pytest.mark.parametrize("how", ["new_parameter", "assign_load"])
def test_a_tie_broken_mid_run_is_reported_within_two_checked_steps(how: str, model_known: bool) -> None:
    torch.manual_seed(0)
    model = _TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    recording, checker = _record([optimizer], model if model_known else None)
    trigger = 23  # between two periodic checks (every 10 steps after the first 5)
    for step, tokens in _tokens(45):
        if step == trigger and how == "new_parameter":
            model.head.weight = nn.Parameter(model.head.weight.detach().clone())
            optimizer.add_param_group({"params": [model.head.weight], "lr": 3e-3})
        if step == trigger and how == "assign_load":
            model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
        _lm_step(model, optimizer, tokens)
    checker.close()
    [event] = recording.events("tie_broken")
    assert event["severity"] == "warning"
    assert trigger <= event["step"] <= 40, "the first or second check after the break"
    prefix = "" if model_known else "_TinyLM."
    names = [prefix + "embed.weight", prefix + "head.weight"]
    details = event["details"]
    assert details["params"] == names and details["groups"] == [names]
    assert details["shapes"] == {name: [VOCAB, DIM] for name in names}
    assert details["step"] == event["step"]
    assert details["replaced"] == (names[1:] if how == "new_parameter" else names)
    assert details["likely_causes"] and all(isinstance(c, str) for c in details["likely_causes"])
    assert "head.weight" in event["message"] and "separate" in event["message"]
    assert [m["status"] for m in recording.statuses("ties_hold")][-2:] == ["ok", "violated"]


def _train_reloaded(run: h.Run) -> None:
    model = _loaded_on_meta()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run.watch([optimizer], model)
    for _, tokens in _tokens(20):
        _lm_step(model, optimizer, tokens)


@pytest.mark.parametrize("model_known", [True, False], ids=["model", "no-model"])
def test_a_tie_lost_when_loading_on_the_meta_device_is_reported_within_two_steps(model_known: bool) -> None:
    case = h.Case("tie_lost_on_load", _train_reloaded, expect=("tie_broken",), trigger=0, within=2)
    [recording] = h.run_case(case, model_known=model_known)
    verdict = h.judge(case, [recording])
    assert verdict.passed, verdict.problems
    [event] = recording.events("tie_broken")
    assert event["step"] <= 2  # Monitor steps count from 1
    details = event["details"]
    prefix = "" if model_known else "_TinyLM."
    names = [prefix + "embed.weight", prefix + "head.weight"]
    assert details["params"] == names and details["pairs"] == [names]
    assert details["modules"] == {names[0]: "Embedding", names[1]: "Linear"}
    assert details["shapes"] == {name: [VOCAB, DIM] for name in names}
    assert details["identical_at_step"] <= details["differ_at_step"] == details["step"]
    assert any("assign=True" in cause for cause in details["likely_causes"])
    final = h.final_statuses(recording)["ties_hold"]
    assert final["status"] == "violated" and "bit-identical" in final["message"]


def test_a_properly_tied_model_stays_ok() -> None:
    torch.manual_seed(0)
    model = _TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    recording, checker = _record([optimizer], model)
    for _, tokens in _tokens(40):
        _lm_step(model, optimizer, tokens)
    checker.close()
    assert not recording.events("tie_broken")
    status = checker.statuses()["ties_hold"]
    assert status["status"] == "ok" and "embed.weight = head.weight" in status["message"]
    assert status["step"] >= 30  # still checked after the dense first steps
    assert [m["status"] for m in recording.statuses("ties_hold")] == ["unchecked", "ok"]


class _Pair(nn.Module):
    """An embedding and a linear layer of the same shape, both initialised to ``fill``, both trained."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.base = nn.Embedding(VOCAB, DIM)
        self.embed = nn.Embedding(DIM, DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, VOCAB)
        with torch.no_grad():
            self.embed.weight.fill_(fill)
            self.proj.weight.fill_(fill)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.base(tokens) + self.embed(tokens % DIM)
        return self.out(torch.tanh(self.proj(x)))


class _WarmStarted(nn.Module):
    """Two layers of one kind, the second initialised as a copy of the first, trained on their own."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer1 = nn.Linear(DIM, DIM)
        if how == "state_dict":
            self.layer2 = nn.Linear(DIM, DIM)
            self.layer2.load_state_dict(self.layer1.state_dict())
        elif how == "deepcopy":
            self.layer2 = copy.deepcopy(self.layer1)
        else:  # a subclass of the same kind (MultiheadAttention's out_proj class)
            self.layer2 = nn.modules.linear.NonDynamicallyQuantizableLinear(DIM, DIM)
            self.layer2.load_state_dict(self.layer1.state_dict())
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.layer2(torch.tanh(self.layer1(self.embed(tokens))))))


def _lookalike(name: str) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, str]:
    """(model to watch, module to train, optimizer, what the status should be) for each look-alike."""
    torch.manual_seed(0)
    if name == "target_head_not_in_optimizer":
        # A frozen teacher readout initialised from the embedding (other kind, identical at the start),
        # moved by an average, in no optimizer, requires_grad left on.
        online = _TinyLM(tied=False)
        target = nn.Linear(DIM, VOCAB, bias=False)
        target.weight.data.copy_(online.embed.weight)
        model = nn.ModuleDict({"online": online, "ema": nn.ModuleDict({"head": target})})
        return model, online, torch.optim.AdamW(online.parameters(), lr=1e-2), "unchecked"
    if name.startswith("ema"):
        online = _TinyLM()
        ema = copy.deepcopy(online)  # its embed and head: identical to online.embed, of other kinds
        if name != "ema_trainable_not_in_optimizer":  # that one keeps requires_grad=True
            ema.requires_grad_(False)
        model = nn.ModuleDict({"online": online, "ema": ema})
        params = model.parameters() if name == "ema_frozen_in_optimizer" else online.parameters()
        return model, online, torch.optim.AdamW(params, lr=1e-2), "ok"
    if name.startswith("fill"):
        model = _Pair(0.0 if name == "fill_zeros" else 0.1)
        return model, model, torch.optim.AdamW(model.parameters(), lr=1e-2), "unchecked"
    model = _WarmStarted(name.removeprefix("warm_start_"))
    return model, model, torch.optim.AdamW(model.parameters(), lr=1e-2), "unchecked"


@pytest.mark.parametrize("model_known", [True, False], ids=["model", "no-model"])
@pytest.mark.parametrize("name", ["ema_not_in_optimizer", "ema_trainable_not_in_optimizer",
                                  "ema_frozen_in_optimizer", "target_head_not_in_optimizer", "fill_zeros",
                                  "fill_constant", "warm_start_state_dict", "warm_start_deepcopy",
                                  "warm_start_subclass"])
def test_parameters_that_only_look_tied_stay_quiet(name: str, model_known: bool) -> None:
    model, trained, optimizer, expected = _lookalike(name)
    recording, checker = _record([optimizer], model if model_known else None)
    for _, tokens in _tokens(25):
        _lm_step(trained, optimizer, tokens)
        if name.startswith("ema"):
            with torch.no_grad():
                for online, target in zip(model.online.parameters(), model.ema.parameters(), strict=True):
                    target.lerp_(online, 0.1)
        if name.startswith("target"):
            with torch.no_grad():
                model.ema.head.weight.lerp_(model.online.head.weight, 0.1)
    checker.close()
    assert not recording.events("tie_broken")
    status = checker.statuses()["ties_hold"]
    assert "violated" not in [m["status"] for m in recording.statuses("ties_hold")]
    if model_known or not name.startswith(("ema", "target")):  # without a model: the trained part only
        assert status["status"] == expected, status
    if expected == "unchecked":
        assert "nothing to check" in status["message"]
    if name.startswith("fill") or (model_known and name.startswith("target")):  # compared, ruled out
        assert "same-shape matrix pairs" in status["message"]


def test_without_ties_or_look_alikes_the_status_says_there_is_nothing_to_check() -> None:
    model = h.mlp((8, 32, 32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    recording, checker = _record([optimizer], model)
    for _, batch in h.batches(12):
        h.train_step(model, optimizer, batch)
    checker.close()
    [status] = recording.statuses("ties_hold")  # known from the start: no message changes
    assert status["status"] == "unchecked" and "nothing to check" in status["message"]


# A plain script (no tuimon import) for ``tuimon run``. ``lost_tie``: a tied language model saved as
# separate copies, rebuilt on the meta device and loaded with assign=True. ``look_alike``: a tied
# model whose second mixing layer is a warm-started copy of the first (same kind, identical at the
# start, trained apart on purpose) and an EMA copy (identical across kinds, moved by an average, in
# no optimizer).
_ZERO_CODE_SCRIPT = textwrap.dedent("""
    import copy
    import sys

    import torch
    from torch import nn


    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.mix = nn.Linear(16, 16)
            self.mix2 = nn.Linear(16, 16)
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(torch.tanh(self.mix2(torch.tanh(self.mix(self.embed(tokens))))))


    torch.manual_seed(0)
    ema = None
    if sys.argv[1] == "lost_tie":
        state = {name: tensor.clone() for name, tensor in LM().state_dict().items()}
        with torch.device("meta"):
            model = LM()
        model.load_state_dict(state, assign=True)
        assert model.head.weight is not model.embed.weight
    else:
        model = LM()
        model.mix2.load_state_dict(model.mix.state_dict())
        ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        tokens = torch.randint(0, 50, (8, 12), generator=g)
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()
        if ema is not None:
            with torch.no_grad():
                for target, online in zip(ema.parameters(), model.parameters()):
                    target.lerp_(online, 0.1)
""")


def _zero_code_run(tmp_path: Path, mode: str) -> list[dict]:
    """Run the script under ``tuimon run`` (a real subprocess); the messages it recorded."""
    script = tmp_path / "train_lm.py"
    script.write_text(_ZERO_CODE_SCRIPT)
    prefix = tmp_path / mode / "rec"
    result = subprocess.run(
        [sys.executable, "-m", "tuimon.cli", "run", "--run", mode, "--record", str(prefix), "--gpu", "none",
         "--", sys.executable, str(script), mode],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    [recording] = sorted(prefix.parent.glob("rec.rank*.jsonl"))
    return [json.loads(line) for line in recording.read_text().splitlines()]


@pytest.mark.parametrize("mode", ["lost_tie", "look_alike"])
def test_zero_code_mode_reports_a_tie_lost_at_load_and_not_its_look_alikes(tmp_path: Path, mode: str) -> None:
    """``tuimon run`` builds the Monitor inside the first step() and finds the model at a later forward:
    the pairs identical before the first step are kept by value and sorted by module kind then."""
    messages = _zero_code_run(tmp_path, mode)
    assert messages[-1]["type"] == "run_end" and messages[-1]["step"] == 12
    events = [m for m in messages if m["type"] == "event" and m["kind"] == "tie_broken"]
    statuses = [m for m in messages if m["type"] == "invariant" and m["name"] == "ties_hold"]
    if mode == "look_alike":
        assert not events
        assert "violated" not in [m["status"] for m in statuses]
        final = statuses[-1]
        assert final["status"] == "ok" and "LM.embed.weight = LM.head.weight" in final["message"]
        return
    [event] = events
    assert event["severity"] == "warning"
    assert event["step"] == 2, "the first check after the model is found at the second forward"
    names = ["LM.embed.weight", "LM.head.weight"]
    details = event["details"]
    assert details["pairs"] == [names]
    assert details["modules"] == {names[0]: "Embedding", names[1]: "Linear"}
    assert details["identical_at_step"] < details["differ_at_step"]
    assert "bit-identical when training started" in event["message"]
    assert statuses[-1]["status"] == "violated"


def test_a_layer_put_to_use_mid_run_without_the_optimizer_is_named_at_the_next_ownership_check(
    tmp_path: Path,
) -> None:
    """Through a Monitor, whose steps are mostly quiet (``Monitor._quiet_step``: the loss's graph is
    not offered there): from step 301 the loop sends the output through a layer it never gave the
    optimizer. The ownership check walks the graph on the two steps before each of its checks
    (every 100 steps), so those steps must still take the full path: the layer is named at the
    check after it came into use, step 401."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    late = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "late.jsonl"
    quiet = 0
    with Monitor(model, optimizer, run="late-layer", record=record, gpu="none") as mon:
        for step in range(1, 451):
            out = model(torch.randn(16, 32))
            loss = nn.functional.cross_entropy(late(out) if step > 300 else out, torch.randint(0, 4, (16,)))
            loss.backward()
            optimizer.step()
            quiet += mon._quiet > 0
            mon.step(loss)
            optimizer.zero_grad()
    # How many steps are quiet depends on the step times the budgets read: 257 of 450 in one CI run.
    assert quiet > 150, "the quiet path was taken (else this test shows nothing about it)"
    [event] = [e for e in of_type(read_messages(record), "event") if e["kind"] == "unowned_tensors"]
    assert event["step"] == 401, event
    assert {t["shape"][0] for t in event["details"]["tensors"]} == {4}, event["details"]
