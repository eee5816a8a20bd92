"""Per-layer measurements on real models: what a sample holds, when it is taken, what it costs.

Everything runs real PyTorch on the CPU; the CUDA test (no host-device synchronisation on the hot
path) runs where a GPU exists and is skipped elsewhere.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from publisher.measure.fetch import DeviceFetch
from publisher.monitor import Monitor
from publisher.readings.memory import MemoryReader
from publisher.stats.grad_norm import GradNormer
from publisher.stats.layer_sample import ACTIVATION_FIELDS, spread
from publisher.stats.probes import activation_stats, rows_per_unit
from publisher.stats.sampler import LayerSampler, StatsConfig, default_modules


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def data(steps: int, seed: int = 0, batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, 1, generator=g)) for _ in range(steps)]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, mon: Monitor | None, steps: int) -> None:
    for x, y in data(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if mon is not None:
            mon.step(loss)


def recorded(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- statistics of one tensor ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 16), (4, 12, 16), (4, 16, 5, 5)])
def test_activation_stats_match_a_direct_computation(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    x = torch.relu(torch.randn(shape))
    unit_dim = 1 if len(shape) == 4 else len(shape) - 1
    x.select(unit_dim, 3).zero_()  # one dead unit
    x.select(unit_dim, 7).zero_()  # and another
    stats = dict(zip(ACTIVATION_FIELDS, activation_stats(x).tolist(), strict=True))
    units = shape[unit_dim]
    expected = {
        "min": 0.0, "max": x.max().item(), "mean": x.mean().item(), "std": x.std(correction=0).item(),
        "nan": 0.0, "inf": 0.0, "zero_frac": (x == 0).float().mean().item(), "dead_frac": 2 / units,
    }
    assert stats == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert rows_per_unit(x) == x.numel() // units


def test_activation_stats_count_nan_and_inf_and_all_zero_outputs() -> None:
    x = torch.zeros(16, 10)
    x[2, 3], x[5, 5], x[6, 6] = math.nan, math.inf, -math.inf
    stats = dict(zip(ACTIVATION_FIELDS, activation_stats(x).tolist(), strict=True))
    assert (stats["nan"], stats["inf"]) == (1, 2)
    assert stats["zero_frac"] == pytest.approx(157 / 160)  # NaN and Inf are not zeros
    assert stats["dead_frac"] == pytest.approx(7 / 10)
    assert math.isnan(stats["mean"])
    bf16 = activation_stats(torch.ones(4, 4, dtype=torch.bfloat16))
    assert bf16.dtype == torch.float32 and bf16.tolist()[2] == 1.0


def test_gradient_norms_cover_sparse_and_missing_gradients() -> None:
    embedding = nn.Embedding(50, 4, sparse=True)
    dense, unused = nn.Linear(4, 1), nn.Linear(4, 1)
    params = [embedding.weight, *dense.parameters(), *unused.parameters()]
    dense(embedding(torch.tensor([1, 2, 2]))).sum().backward()
    norms = GradNormer()(params)
    assert norms is not None and norms.indices == [0, 1, 2], "the unused layer has no gradient"
    expected = [embedding.weight.grad.coalesce().values().norm(), dense.weight.grad.norm(),
                dense.bias.grad.norm()]
    assert norms.norms.tolist() == pytest.approx([v.item() for v in expected], rel=1e-5)
    assert norms.total.item() == pytest.approx(math.sqrt(sum(v.item() ** 2 for v in expected)), rel=1e-5)
    assert GradNormer()([p for p in unused.parameters()]) is None


# -- samples in a real training loop ----------------------------------------------------------------


def test_samples_report_every_layer_by_name_with_exact_update_ratios(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    record = tmp_path / "run.jsonl"
    snapshots: list[list[torch.Tensor]] = []
    optimizer.register_step_pre_hook(
        lambda *_: snapshots.append([p.detach().clone() for p in model.parameters()]))
    with Monitor(model, optimizer, run="layers", record=record, gpu="none", invariants=False,
                 stats=StatsConfig(every=5, dense=3, budget=1.0)) as mon:
        train(model, optimizer, mon, 8)
    metrics = [m for m in recorded(record) if m["type"] == "metrics"]
    sampled = [m["step"] for m in metrics if "layers" in m]
    assert sampled == [1, 2, 3, 8], "each of the first 3 steps, then every 5 steps"
    step8 = next(m for m in metrics if m["step"] == 8)
    layers = step8["layers"]
    names = ["0.weight", "0.bias", "3.weight", "3.bias", "5.weight", "5.bias"]
    assert layers["params"]["name"] == names and layers["complete"] is True
    assert layers["params"]["shape"][0] == [32, 8]
    before, after = snapshots[7], [p.detach() for p in model.parameters()]
    true_ratios = [((a - b).norm() / b.norm()).item() for a, b in zip(after, before, strict=True)]
    # Parameters of at most 1024 elements are compared whole: the ratio is exact.
    assert layers["params"]["update_ratio"] == pytest.approx(true_ratios, rel=1e-4)
    assert layers["params"]["param_norm"] == pytest.approx([p.norm().item() for p in after], rel=1e-5)
    total = math.sqrt(sum(p.norm().item() ** 2 for p in after))
    assert step8["metrics"]["param_norm"] == pytest.approx(total)
    assert 0 < step8["metrics"]["update_ratio"] < 1
    modules = layers["modules"]
    assert modules["name"] == ["0", "1", "3", "4", "5"], "leaf layers; dropout is zeros by design"
    assert modules["type"] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"] and modules["rows"] == [32] * 5
    assert modules["min"][1] == 0 and 0.2 < modules["zero_frac"][1] < 0.8, "a ReLU output"
    assert "layers" not in metrics[3] and "update_ratio" not in metrics[3]["metrics"]


@pytest.mark.parametrize("loop", ["plain", "clip before backward"])
def test_samples_keep_their_cadence_when_every_step_takes_the_monitors_full_path(
    tmp_path: Path, loop: str
) -> None:
    """Between samples most steps are quiet ones (``Monitor.step``'s short path); a loop whose every
    step needs the full one (here: it clips before backward, so there is nothing to clip, which is
    reported on every step) is sampled on the same steps, not on nearly every step."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "cadence.jsonl"
    with Monitor(model, optimizer, run="cadence", record=record, gpu="none",
                 stats=StatsConfig(every=20, dense=3, budget=1.0)) as mon:
        clip = torch.nn.utils.clip_grad_norm_  # looked up once the Monitor has wrapped it
        for x, y in data(120):
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            if loop == "clip before backward":
                clip(model.parameters(), 1.0)
            loss.backward()
            optimizer.step()
            mon.step(loss)
    metrics = [m for m in recorded(record) if m["type"] == "metrics"]
    assert [m["step"] for m in metrics if "layers" in m] == [1, 2, 3, 23, 43, 63, 83, 103]
    assert all(("clip_noop_calls" in m["metrics"]) == (loop != "plain") for m in metrics)


def test_forward_hooks_exist_only_while_a_sample_is_taken() -> None:
    """The layers' hooks, that is: the model's root keeps the non-finite check's two hooks for
    good (publisher/nonfinite/capture.py), the layers none between samples."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    layers = list(model.children())
    hooked = []
    with Monitor(model, optimizer, run="hooks", gpu="none", invariants=False,
                 stats=StatsConfig(every=4, dense=0, budget=1.0)) as mon:
        for x, y in data(12):
            hooked.append(sum(len(m._forward_hooks) for m in layers))
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            assert sum(len(m._forward_hooks) for m in layers) == 0, "removed once they fired"
            loss.backward()
            optimizer.step()
            mon.step(loss)
    # The first step is sampled (the hooks could not be armed before it), then every 4: armed
    # before steps 5 and 9, 5 modules each time.
    assert hooked == [0, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0]


def test_an_evaluation_forward_is_not_sampled_and_patterns_choose_modules(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "run.jsonl"
    with Monitor(model, optimizer, run="eval", record=record, gpu="none", invariants=False,
                 stats=StatsConfig(every=2, dense=0, modules=("*.4", "1"), budget=1.0)) as mon:
        for step, (x, y) in enumerate(data(6), start=1):
            if step % 2 == 1:  # before each sampled training forward: an evaluation forward
                model.eval()
                with torch.no_grad():
                    model(torch.full_like(x, -1e3))  # would kill every ReLU if it were sampled
                model.train()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            mon.step(loss)
    samples = [m["layers"] for m in recorded(record) if m["type"] == "metrics" and "layers" in m]
    assert [s["modules"]["name"] for s in samples[1:]] == [["1"], ["1"]], "pattern '*.4' matches nothing"
    assert all(s["modules"]["zero_frac"][0] < 0.9 for s in samples[1:]), "the training forward was measured"


def test_default_modules_are_spread_over_a_deep_model() -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(50)])
    chosen = default_modules([("", model)], (), 8)
    assert len(chosen) == 8 and chosen[0][0] == "0.0" and chosen[-1][0] == "49.1"
    assert spread(list(range(10)), 3) == [0, 4, 9] and spread([1, 2], 5) == [1, 2]


def test_the_published_payload_is_bounded_and_keeps_the_first_and_last_layers(tmp_path: Path) -> None:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(30)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "run.jsonl"
    with Monitor(model, optimizer, run="big", record=record, gpu="none", invariants=False,
                 stats=StatsConfig(max_published=10, budget=1.0)) as mon:
        for _ in range(2):
            optimizer.zero_grad()
            loss = model(torch.randn(2, 4)).sum()
            loss.backward()
            optimizer.step()
            mon.step(loss)
    layers = [m for m in recorded(record) if m["type"] == "metrics"][-1]["layers"]
    names = layers["params"]["name"]
    assert len(names) == 10 and names[0] == "0.weight" and names[-1] == "29.bias"
    assert layers["truncated"] == 60 - 10 + 30 - 10


def test_samples_are_spaced_out_when_they_cost_more_than_their_budget() -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    sampler = LayerSampler(StatsConfig(every=2, dense=0, budget=1e-6), model, [optimizer], lambda: params)
    sampled = []
    for _ in range(40):
        sampled.append(sampler.sampling)
        if sampler.sampling:
            sampler.collect(None)
        sampler.advance(step_time=0.001)
    # A sample costs far more than a millionth of a millisecond step: once measured (not on the
    # first step, which pays one-off set-up), the next sample is pushed far beyond ``every``.
    assert sampled[:3] == [True, False, True]
    assert not any(sampled[3:])
    sampler.close()


def test_without_a_model_the_model_is_found_at_a_forward_and_named(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "run.jsonl"
    with Monitor(None, optimizer, run="zero-code", record=record, gpu="none", invariants=False,
                 stats=StatsConfig(budget=1.0)) as mon:
        train(model, optimizer, mon, 4)
    last = [m for m in recorded(record) if m["type"] == "metrics"][-1]["layers"]
    assert last["params"]["name"][0] == "Sequential.0.weight"
    assert last["modules"]["name"][:2] == ["Sequential.0", "Sequential.1"]


def test_a_non_finite_gradient_norm_names_the_parameters_on_any_step(tmp_path: Path) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "run.jsonl"
    with Monitor(model, optimizer, run="nan-grad", record=record, gpu="none", invariants=False,
                 grad_norm_budget=1.0, stats=StatsConfig(every=100, dense=1, budget=1.0)) as mon:
        for step, (x, y) in enumerate(data(8), start=1):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if step == 6:
                model[5].weight.grad[0, 0] = math.inf  # an overflow in one layer's backward
            mon.step(loss)
    metrics = {m["step"]: m for m in recorded(record) if m["type"] == "metrics"}
    bad = metrics[6]["layers"]
    assert bad["complete"] is False and bad["params"]["grad_norm"][4] == "inf"
    assert bad["params"]["grad_norm"][0] != "inf" and bad["modules"]["name"] == []
    assert "layers" not in metrics[7]
    events = [m for m in recorded(record) if m["type"] == "event"]
    assert [(e["kind"], e["severity"], e["step"]) for e in events] == [("nonfinite_grad", "critical", 6)]
    assert events[0]["details"]["params"] == ["5.weight"]


# -- transfers and memory ----------------------------------------------------------------------------


def test_batches_reach_their_callbacks_in_order() -> None:
    fetch = DeviceFetch()
    seen: list[tuple[int, list[float]]] = []
    for i in range(3):
        fetch.submit([torch.tensor(float(i)), torch.arange(2.0) + i],
                     lambda values, i=i: seen.append((i, [v.tolist() for v in values])))
    assert seen == [(0, [0.0, [0.0, 1.0]]), (1, [1.0, [1.0, 2.0]]), (2, [2.0, [2.0, 3.0]])]
    assert not fetch.pending


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_batches_share_copies_and_reach_their_callbacks_in_order() -> None:
    """Fast steps' tensors wait to share one copy (a CUDA call from Python costs the host ~10 us);
    CPU numbers between them keep their place; a bfloat16 loss arrives as float32."""
    fetch = DeviceFetch(gather_s=60.0)
    seen: list[tuple[int, list[Any]]] = []
    for i in range(10):
        on_device = torch.full((), float(i), device="cuda", dtype=torch.bfloat16 if i % 3 else torch.float32)
        tensors = [torch.tensor(-1.0)] if i == 4 else [on_device, torch.arange(3.0, device="cuda") + i]
        fetch.submit(tensors, lambda values, i=i: seen.append((i, [v.tolist() for v in values])))
    assert [i for i, _ in seen] in ([], [0]) and fetch.pending, "the first one copies; the rest wait together"
    fetch.drain(wait=True)
    assert not fetch.pending
    assert seen == [(i, [-1.0] if i == 4 else [[float(i)], [float(i), i + 1.0, i + 2.0]]) for i in range(10)]


def test_memory_is_read_at_its_interval_or_every_few_steps_not_sooner_than_its_floor() -> None:
    reader = MemoryReader(interval_s=0.5, every_steps=4)
    values = reader.read(now=10.0)
    assert values["host_mem_bytes"] > 10_000_000 and "cuda_mem_allocated" not in values
    assert [reader.due(10.1 + i / 100) for i in range(4)] == [False, False, False, True], "the 4th step"
    reader.read(now=20.0)
    assert [reader.due(20.001 + i / 1000) for i in range(6)] == [False] * 6, "fast steps: not within 20 ms"
    assert reader.due(20.03)
    slow = MemoryReader(interval_s=0.5, every_steps=1_000_000)
    slow.read(now=10.0)
    assert not slow.due(10.49) and slow.due(10.5), "long steps: every interval_s"
    with pytest.raises(ValueError, match="memory interval"):
        MemoryReader(interval_s=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_hot_path_never_synchronises_with_the_gpu(tmp_path: Path) -> None:
    """Every step (sampled ones included) queues its work and copies asynchronously: with torch's
    sync debug mode set to "error", any host-device synchronisation in Monitor.step raises."""
    device = torch.device("cuda")
    model = mlp().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    record = tmp_path / "run.jsonl"
    batches = [(x.to(device), y.to(device)) for x, y in data(33)]

    def one_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        mon.step(loss, accuracy=loss * 0)

    with Monitor(model, optimizer, run="cuda", record=record, gpu="none", grad_norm_budget=1.0,
                 memory_interval_s=0.0, stats=StatsConfig(every=3, budget=1.0)) as mon:
        for x, y in batches[:3]:  # allocator and kernels warm up
            one_step(x, y)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for x, y in batches[3:]:
                one_step(x, y)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    metrics = [m for m in recorded(record) if m["type"] == "metrics"]
    assert [m["step"] for m in metrics] == list(range(1, 34)), "every step published, in order"
    assert all(isinstance(m["metrics"]["loss"], float) and "grad_norm" in m["metrics"] for m in metrics)
    assert metrics[-1]["metrics"]["cuda_mem_allocated"] > 0
    assert any("layers" in m and m["layers"]["modules"]["name"] for m in metrics[3:])


def test_a_float64_model_is_measured_like_any_other(tmp_path: Path) -> None:
    model = mlp().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    record = tmp_path / "run.jsonl"
    with Monitor(model, optimizer, run="double", record=record, gpu="none", grad_norm_budget=1.0) as mon:
        for x, y in data(3):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x.double()), y.double())
            loss.backward()
            optimizer.step()
            mon.step(loss)
        assert mon.telemetry_errors == 0
    metrics = [m for m in recorded(record) if m["type"] == "metrics"]
    reference = math.sqrt(sum(p.grad.norm().item() ** 2 for p in model.parameters()))
    assert metrics[-1]["metrics"]["grad_norm"] == pytest.approx(reference, rel=1e-5)
    assert metrics[-1]["layers"]["params"]["param_norm"][0] == pytest.approx(model[0].weight.norm().item())
