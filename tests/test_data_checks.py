"""Checks that read how the loop uses data and torch: repeated batches, clipping that clips nothing,
a classifier stuck at chance. Real DataLoaders (worker processes included), real training loops
on the CPU, the Monitor's recording read back."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.recordings import of_type, read_messages
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from publisher.detectors import Finding
from publisher.detectors.data import DuplicateBatches
from publisher.monitor import Monitor
from publisher.patches import torch_calls
from publisher.readings.batches import LoaderBook, loader_shuffles


class Procedural(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic samples drawn from the global generator: what a worker's seed decides."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(8), torch.randn(1)


def same_seed(worker_id: int) -> None:
    torch.manual_seed(1234)  # the bug: 1234 + worker_id was meant


def duplicate_findings(loaders: Iterable[Iterable[Any]], detector: DuplicateBatches | None = None
                       ) -> list[Finding]:
    """Feed every batch of the given passes (one iterable per pass) to the duplicate check."""
    detector = detector or DuplicateBatches()
    book, found = LoaderBook(), []
    for step, loader in enumerate(loaders):
        passes = book.passes_for(loader)
        passes.new_pass()
        for batch in loader:
            found.extend(detector.observe_batches(step, [p for p in [passes.print_of(batch)] if p]))
    return found


def epochs(loader: Any, count: int) -> Iterator[Any]:
    yield from (loader for _ in range(count))


def test_the_loader_order_is_read_from_the_loader_its_iterator_or_its_sampler() -> None:
    data = TensorDataset(torch.arange(10.0))
    assert loader_shuffles(DataLoader(data, shuffle=True)) == (True, False)
    assert loader_shuffles(DataLoader(data)) == (False, False)
    assert loader_shuffles(iter(DataLoader(data, batch_size=2, shuffle=True))) == (True, False)
    assert loader_shuffles(DataLoader(data, batch_size=None, shuffle=True)) == (True, False)
    weighted = WeightedRandomSampler([1.0] * 10, num_samples=10)
    assert loader_shuffles(DataLoader(data, sampler=weighted)) == (True, True)
    assert loader_shuffles([torch.zeros(3)]) == (False, False)


def test_workers_seeded_alike_yield_repeated_batches_that_are_named() -> None:
    loader = DataLoader(Procedural(64), batch_size=8, shuffle=True, num_workers=2, worker_init_fn=same_seed)
    found = duplicate_findings([loader])
    assert found, "two workers seeded alike yield the same batches"
    first = found[0]
    assert first.kind == "duplicate_batches" and first.details["test"] == "within a pass"
    assert (first.details["batch"], first.details["same_as_batch"]) == (1, 0), "named at the first repeat"
    assert "2 workers" in first.message


def seed_from_torch(worker_id: int) -> None:
    """The documented pattern: derive the seed from the one torch drew for this worker this epoch."""
    torch.manual_seed(torch.initial_seed() % 2**32)


def seed_by_worker(worker_id: int) -> None:
    torch.manual_seed(1234 + worker_id)  # apart across workers, but the same every epoch


def test_on_a_long_pass_runs_of_consecutive_batches_are_compared() -> None:
    """Past the first batches of a pass only runs of consecutive batches are fingerprinted (an
    eighth of the cost): pairs of identical neighbours (two workers seeded alike) are still seen."""
    distinct = [torch.randn(16, 32) for _ in range(100)]
    pairs = [batch for batch in torch.randn(100, 16, 32) for _ in range(2)]  # 0 0 1 1 2 2 ...
    found = duplicate_findings([distinct + pairs])
    assert found and found[0].details["batch"] == 129 and found[0].details["same_as_batch"] == 128


def test_workers_seeded_the_documented_way_yield_no_repeat() -> None:
    loader = DataLoader(Procedural(64), batch_size=8, shuffle=True, num_workers=2,
                        worker_init_fn=seed_from_torch)
    assert duplicate_findings(epochs(loader, 3)) == []


def test_workers_seeded_by_worker_id_alone_replay_every_epoch() -> None:
    loader = DataLoader(Procedural(64), batch_size=8, shuffle=True, num_workers=2,
                        worker_init_fn=seed_by_worker)
    found = duplicate_findings(epochs(loader, 3))
    assert [(f.details["test"], f.details["epoch"]) for f in found] == [
        ("epoch replayed", 1), ("epoch replayed", 2)]


def test_a_shuffle_that_replays_every_epoch_is_named_at_the_second_batch() -> None:
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))

    def replayed() -> Iterator[DataLoader[Any]]:
        for _ in range(3):  # the bug: the sampler's generator re-seeded with one value every epoch
            yield DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))

    found = duplicate_findings(replayed())
    assert [f.details["test"] for f in found] == ["epoch replayed"] * 2, "once per replayed pass"
    assert found[0].details["epoch"] == 1 and found[0].details["batches_compared"] == 2


def test_a_healthy_shuffle_a_validation_loader_and_tiny_datasets_repeat_nothing() -> None:
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    assert duplicate_findings(epochs(DataLoader(data, batch_size=16, shuffle=True), 4)) == []
    unshuffled = DataLoader(data, batch_size=16)
    assert duplicate_findings(epochs(unshuffled, 4)) == [], "an unshuffled loader repeats by design"
    smaller_than_a_batch = DataLoader(TensorDataset(torch.randn(5, 32)), batch_size=8, shuffle=True)
    assert duplicate_findings(epochs(smaller_than_a_batch, 50)) == []
    # six single samples, shuffled, for 400 epochs: the same order comes back by chance (1 in 720)
    six = DataLoader(TensorDataset(torch.randn(6, 100)), batch_size=1, shuffle=True,
                     generator=torch.Generator().manual_seed(3))
    assert duplicate_findings(epochs(six, 400)) == []


def test_sampling_with_replacement_and_tiny_samples_are_not_duplicates() -> None:
    images = TensorDataset(torch.randn(3, 256))  # three distinct samples oversampled one at a time
    oversampled = DataLoader(images, sampler=WeightedRandomSampler([1.0, 1.0, 8.0], num_samples=30))
    assert duplicate_findings(epochs(oversampled, 3)) == []
    tokens = TensorDataset(torch.randint(0, 4, (200, 2)))  # two-token samples: repeats are expected
    assert duplicate_findings(epochs(DataLoader(tokens, batch_size=1, shuffle=True), 2)) == []


def test_a_deliberately_repeated_batch_is_quiet_when_the_user_says_so(tmp_path: Path) -> None:
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    kinds = {}
    for deliberate in (False, True):
        record = tmp_path / f"overfit-{deliberate}.jsonl"
        with Monitor(model, optimizer, record=record, gpu="none", repeated_batches=deliberate) as mon:
            for bx, by in mon.track_data([(x, y)] * 20):  # overfit one batch: the same batch 20 times
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(bx), by)
                loss.backward()
                optimizer.step()
                mon.step(loss)
        kinds[deliberate] = {e["kind"]: e["step"] for e in of_type(read_messages(record), "event")}
    assert kinds[False].get("duplicate_batches") == 2, "named on the step that used the repeat"
    assert "duplicate_batches" not in kinds[True]


def classifier(classes: int = 10) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, classes))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def clip_events(tmp_path: Path, order: str, steps: int = 8) -> dict[str, int]:
    model, optimizer = classifier()
    record = tmp_path / f"clip-{order.replace(' ', '-')}.jsonl"
    clip_norm, clip_value = torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_
    with Monitor(model, optimizer, record=record, gpu="none") as mon:
        for _ in range(steps):
            x, y = torch.randn(32, 20), torch.randint(0, 10, (32,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if order == "before backward":
                clip_norm(model.parameters(), 1.0)
            loss.backward()
            if order == "after backward":
                clip_norm(model.parameters(), 1.0)
                clip_value(model[0].parameters(), 0.5)
            optimizer.step()
            mon.step(loss)
            optimizer.zero_grad(set_to_none=order == "before backward")
            if order == "norm after zero_grad":
                clip_norm(model.parameters(), 1.0)  # the zeros zero_grad left: norm 0
            elif order == "value after zero_grad":
                clip_value(model.parameters(), 0.1)  # returns nothing: the zeros are probed
    return {e["kind"]: e["step"] for e in of_type(read_messages(record), "event")}


@pytest.mark.parametrize("order", ["before backward", "norm after zero_grad", "value after zero_grad"])
def test_clipping_that_clips_nothing_is_named_on_the_step_it_preceded(tmp_path: Path, order: str) -> None:
    first = 1 if order == "before backward" else 2  # after zero_grad: it precedes the second step
    assert clip_events(tmp_path, order).get("clip_noop") == first


def test_clipping_after_backward_and_clipping_frozen_parameters_are_quiet(tmp_path: Path) -> None:
    assert "clip_noop" not in clip_events(tmp_path, "after backward")
    model, optimizer = classifier()
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    record = tmp_path / "frozen.jsonl"
    with Monitor(model, optimizer, record=record, gpu="none") as mon:
        for _ in range(5):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 20)), torch.randint(0, 10, (8,)))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(frozen.parameters(), 1.0)  # never has gradients: by design
            optimizer.step()
            mon.step(loss)
    assert "clip_noop" not in {e["kind"] for e in of_type(read_messages(record), "event")}


def test_the_watched_calls_return_what_torch_returns_and_count_the_labels() -> None:
    model, _ = classifier()
    x, y = torch.randn(32, 20), torch.randint(0, 10, (32,))
    seen: list[tuple[int, float | None]] = []
    watch = torch_calls.watch(lambda classes, entropy: seen.append((classes, entropy)))
    try:
        from torch.nn.utils import clip_grad_norm_  # bound after install: the watched one

        loss = torch.nn.functional.cross_entropy(model(x), y)
        with torch.no_grad():
            torch.nn.functional.cross_entropy(model(x), y)  # an evaluation: not the trained loss
        loss.backward()
        reference = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
        assert float(clip_grad_norm_(model.parameters(), 1e6)) == pytest.approx(float(reference))
        assert float(loss.detach()) == pytest.approx(float(torch.nn.CrossEntropyLoss()(model(x).detach(), y)))
        assert seen == [(10, None)], "the class count at once, the prior once the labels are counted"
        for _ in range(torch_calls.COUNTED_CALLS - 1):
            torch.nn.functional.cross_entropy(model(x), y)
    finally:
        torch_calls.unwatch(watch)
    shares = torch.bincount(y, minlength=10).double() / 32
    shares = shares[shares > 0]
    plug_in = float(-(shares * shares.log()).sum())
    labels = 32 * torch_calls.COUNTED_CALLS
    assert seen[1:] == [(10, pytest.approx(plug_in + (len(shares) - 1) / (2 * labels)))]
    assert watch.take_clips_without_gradients() == 0


def train_classifier(tmp_path: Path, name: str, labels: str, steps: int, classes: int = 10,
                     corrupt_at: int | None = None) -> dict[str, int]:
    """Train on fresh inputs each step whose labels follow them (a teacher's, "learnable") or
    not ("shuffled": drawn apart from the inputs, so there is nothing to learn nor to memorise).
    At step ``corrupt_at`` one batch is corrupted: inputs scaled by 30, labels shuffled."""
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(20, classes, generator=generator)
    model, optimizer = classifier(classes)
    record = tmp_path / f"{name}.jsonl"
    with Monitor(model, optimizer, record=record, gpu="none") as mon:
        for step in range(1, steps + 1):
            inputs = torch.randn(64, 20, generator=generator)
            targets = (inputs @ teacher).argmax(1)
            if labels == "shuffled" or step == corrupt_at:
                targets = targets[torch.randperm(64, generator=generator)]
            if step == corrupt_at:
                inputs = inputs * 30
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            mon.step(loss)
    return {e["kind"]: e["step"] for e in of_type(read_messages(record), "event")}


def test_a_classifier_that_learns_nothing_is_named_within_a_hundred_steps(tmp_path: Path) -> None:
    """Half the steps a plateau test needs (~140 steps on such runs): C and the label prior are known."""
    events = train_classifier(tmp_path, "shuffled", "shuffled", steps=160)
    assert events.get("chance_loss", math.inf) <= 100, events


def test_a_classifier_that_learns_is_not_at_chance(tmp_path: Path) -> None:
    assert "chance_loss" not in train_classifier(tmp_path, "learnable", "learnable", steps=300)


def test_one_corrupted_batch_does_not_put_a_learned_classifier_at_chance(tmp_path: Path) -> None:
    """Its loss of ~70 among losses of ~0.5 would lift a plain 48-step mean into the chance band."""
    events = train_classifier(tmp_path, "corrupted", "learnable", steps=360, corrupt_at=300)
    assert events.get("loss_spike") == 300, events
    assert "chance_loss" not in events
