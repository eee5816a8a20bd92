"""Checks that read how the loop uses data and torch: repeated batches, clipping that clips nothing,
a classifier stuck at chance, a loss given the wrong kind of input, labels that cannot teach. Real
DataLoaders (worker processes included), real training loops
on the CPU, the Monitor's recording read back."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.recordings import of_type, read_messages
from torch.utils.data import DataLoader, Dataset, TensorDataset, WeightedRandomSampler

from publisher.detectors import Finding
from publisher.detectors.data import DuplicateBatches
from publisher.detectors.labels import ClassSortedBatches, SingleClassLabels, poisson_binomial_tail
from publisher.detectors.loss_inputs import LossInputMismatch, mismatches
from publisher.monitor import Monitor
from publisher.patches import torch_calls
from publisher.patches.loss_look import LossLook
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


def test_a_loader_and_dataset_made_anew_every_epoch_repeat_nothing() -> None:
    """An unshuffled series whose dataset and DataLoader a script builds again each epoch: the
    last epoch's objects are freed, and Python hands their ids to the new ones, which must not
    make the new pass read as the old one continued (its batch 7 'identical to batch 7 of the
    same pass')."""

    detector, book = DuplicateBatches(), LoaderBook()

    def one_epoch(step: int) -> list[Finding]:  # its dataset and loader are freed on return
        data = TensorDataset(torch.arange(512 * 8, dtype=torch.float32).reshape(512, 8))
        loader = DataLoader(data, batch_size=16)
        passes = book.passes_for(loader)
        passes.new_pass()
        return [found for batch in loader
                for found in detector.observe_batches(step, [p for p in [passes.print_of(batch)] if p])]

    assert [finding for step in range(20) for finding in one_epoch(step)] == []


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
    with Monitor(model, optimizer, record=record, gpu="none") as mon:
        # Looked up once the Monitor has wrapped them (a name bound before is not seen, as
        # publisher/patches/torch_calls.py says): alone, this test would otherwise run unwrapped.
        clip_norm, clip_value = torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_
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
        taken = watch.take_looks()  # the Monitor's step takes them, its step worker reads them
        assert len(taken) == torch_calls.COUNTED_CALLS
        for pending in taken:
            watch.read(pending)
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


F = torch.nn.functional


def looks_of(*calls: Callable[[], Any]) -> list[LossLook]:
    """The looks a watch takes at the losses ``calls`` make, taken after each as a Monitor's step
    does, and read as its step worker does."""
    watch, looks = torch_calls.watch(lambda classes, entropy: None), []
    try:
        for call in calls:
            call()
            looks += [watch.read(pending) for pending in watch.take_looks()]
        return looks
    finally:
        torch_calls.unwatch(watch)


def trained_logits(rows: int = 32, classes: int = 10) -> torch.Tensor:
    torch.manual_seed(rows + classes)
    return torch.nn.Linear(16, classes)(torch.randn(rows, 16))


LABELS = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(0))
BINARY = (torch.rand(32, 1, generator=torch.Generator().manual_seed(1)) < 0.3).float()
TEACHER = torch.randn(32, 10, generator=torch.Generator().manual_seed(2))

WRONG = {
    "softmax then cross_entropy": (lambda: F.cross_entropy(trained_logits().softmax(1), LABELS),
                                   "probabilities_as_logits"),
    "sigmoid then BCEWithLogitsLoss": (
        lambda: torch.nn.BCEWithLogitsLoss()(trained_logits(32, 1).sigmoid(), BINARY),
        "probabilities_as_logits"),
    "softmax then nll_loss": (lambda: F.nll_loss(trained_logits().softmax(1), LABELS),
                              "probabilities_as_log_probabilities"),
    "logits then nll_loss": (lambda: F.nll_loss(trained_logits(), LABELS), "logits_as_log_probabilities"),
    "softmax then kl_div": (
        lambda: F.kl_div(trained_logits().softmax(1), TEACHER.softmax(1), reduction="batchmean"),
        "probabilities_as_log_probabilities"),
    "log-probabilities as kl_div's target": (
        lambda: F.kl_div(trained_logits().log_softmax(1), TEACHER.log_softmax(1), reduction="batchmean"),
        "log_probabilities_as_target"),
    "probabilities said to be log_target": (
        lambda: F.kl_div(trained_logits().log_softmax(1), TEACHER.softmax(1), reduction="batchmean",
                         log_target=True),
        "probabilities_as_log_target"),
    "log-probabilities as a soft target": (lambda: F.cross_entropy(trained_logits(), TEACHER.log_softmax(1)),
                                           "log_probabilities_as_target"),
    "class ids as BCE targets": (
        lambda: F.binary_cross_entropy_with_logits(trained_logits(32, 1), BINARY * 2), "target_out_of_range"),
}
RIGHT = {
    "logits to cross_entropy": lambda: F.cross_entropy(trained_logits(), LABELS),
    "label smoothing": lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.1)(trained_logits(), LABELS),
    "log_softmax to cross_entropy": lambda: F.cross_entropy(trained_logits().log_softmax(1), LABELS),
    "soft targets": lambda: F.cross_entropy(trained_logits(), TEACHER.softmax(1)),
    "log_softmax then nll_loss": lambda: torch.nn.NLLLoss()(trained_logits().log_softmax(1), LABELS),
    "distillation at T=4": lambda: F.kl_div((trained_logits() / 4).log_softmax(1), (TEACHER / 4).softmax(1),
                                            reduction="batchmean"),
    "kl_div on log-probabilities both": lambda: F.kl_div(
        trained_logits().log_softmax(1), TEACHER.log_softmax(1), reduction="batchmean", log_target=True),
    "logits to BCEWithLogitsLoss": lambda: torch.nn.BCEWithLogitsLoss()(trained_logits(32, 1), BINARY),
    "soft BCE targets": lambda: F.binary_cross_entropy_with_logits(trained_logits(32, 1), 0.9 * BINARY + 0.1),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_loss_given_the_wrong_kind_of_input_is_named_with_its_call(case: str) -> None:
    call, problem = WRONG[case]
    [look] = looks_of(call)
    assert [m.problem for m in mismatches(look)] == [problem]
    assert look.site.startswith(__file__), "the user's line, not torch's nor tuimon's"
    findings = LossInputMismatch().observe_loss_calls(7, looks_of(call, call, call))
    [finding] = findings
    assert finding.kind == "loss_input_mismatch" and finding.details["problem"] == problem
    assert finding.details["input_shape"] == list(look.input.shape) and finding.details["step"] == 7


@pytest.mark.parametrize("case", sorted(RIGHT))
def test_correct_uses_of_the_losses_are_quiet(case: str) -> None:
    [look] = looks_of(RIGHT[case])
    assert mismatches(look) == []


def test_a_wrong_loss_input_starting_mid_run_is_named_from_the_looks_of_quiet_steps(tmp_path: Path) -> None:
    """Past the first steps most of a small CPU model's steps are quiet (``Monitor.step``'s short
    path): the looks at their loss calls ride with them to the step worker, so a softmax fed to
    ``cross_entropy`` from step 300 on is named, at that step or later, with its call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, labels = torch.randn(32, 16), torch.randint(0, 10, (32,))
    record = tmp_path / "mid_run_softmax.jsonl"
    with Monitor(model, optimizer, record=record, gpu="none") as mon:
        for step in range(1, 2001):
            logits = model(inputs)
            loss = F.cross_entropy(logits.softmax(1) if step >= 300 else logits, labels)
            loss.backward()
            optimizer.step()
            mon.step(loss)
            optimizer.zero_grad()
    events = [e for e in of_type(read_messages(record), "event") if e["kind"] == "loss_input_mismatch"]
    assert events, "the wrong input was never named"
    event = events[0]  # the episode's first event (its count grows in the next ones)
    assert event["step"] >= 300 and event["details"]["problem"] == "probabilities_as_logits"
    assert event["details"]["call_site"].startswith(__file__), "the user's line, not torch's nor tuimon's"


def test_logits_that_happen_to_lie_in_the_unit_interval_are_not_probabilities() -> None:
    """A fresh discriminator's logits sit in [0, 1] for dozens of steps (its bias): only a sigmoid's
    output, seen through views, is taken for probabilities; and a sigmoid of a batch of 2 needs
    more looks (40 values)."""
    torch.manual_seed(0)
    discriminator = torch.nn.Linear(2, 1)
    torch.nn.init.constant_(discriminator.bias, 0.5)
    torch.nn.init.normal_(discriminator.weight, std=0.01)
    x, ones = torch.randn(32, 2), torch.ones(32)
    fresh = lambda: F.binary_cross_entropy_with_logits(discriminator(x).squeeze(1), ones)  # noqa: E731
    assert [look.input.min >= 0 for look in looks_of(fresh)] == [True]
    assert LossInputMismatch().observe_loss_calls(1, looks_of(*[fresh] * 10)) == []
    squashed = lambda: F.binary_cross_entropy_with_logits(discriminator(x).sigmoid().squeeze(1), ones)  # noqa: E731
    [look] = looks_of(squashed)
    assert look.made_by == "Sigmoid" and [m.problem for m in mismatches(look)] == ["probabilities_as_logits"]
    detector, pair = LossInputMismatch(), lambda: F.binary_cross_entropy_with_logits(
        discriminator(x[:2]).sigmoid(), ones[:2, None])
    assert detector.observe_loss_calls(1, looks_of(*[pair] * 19)) == []
    assert detector.observe_loss_calls(2, looks_of(pair))


def test_the_watched_losses_return_what_torch_returns_and_out_of_range_labels_still_raise() -> None:
    logits = trained_logits()
    watch = torch_calls.watch(lambda classes, entropy: None)
    try:
        unwrapped = F.cross_entropy.__wrapped__  # type: ignore[attr-defined]
        assert F.cross_entropy(logits, LABELS).item() == unwrapped(logits, LABELS).item()
        with pytest.raises(IndexError, match="out of bounds"):  # torch says it loudly: left to it
            F.cross_entropy(logits, LABELS + 1)
    finally:
        torch_calls.unwatch(watch)


def test_after_the_first_calls_a_loss_is_looked_at_once_in_sixteen_where_calls_leave_time() -> None:
    logits = trained_logits(64)
    labels = torch.randint(0, 10, (64,))

    def call_of_a_slower_step() -> torch.Tensor:
        time.sleep(0.03)  # a look (well under a millisecond) is then far below its share of a call
        return F.cross_entropy(logits, labels)

    eager = [lambda: F.cross_entropy(logits, labels)] * torch_calls.COUNTED_CALLS
    looks = looks_of(*eager, *[call_of_a_slower_step] * (16 * 4))
    assert len(looks) == torch_calls.COUNTED_CALLS + 4
    small = torch.randint(0, 10, (2,))
    tiny = looks_of(*[lambda: F.cross_entropy(logits[:2], small)] * (torch_calls.EAGER_CALLS + 16))
    assert len(tiny) == torch_calls.EAGER_CALLS + 1, "tiny batches: every one of the first 512 calls"


def test_looks_come_further_apart_where_they_cost_more_than_their_share_of_the_time_between_calls() -> None:
    """Calls back to back (a step of microseconds): a look costs far more than LOOK_BUDGET of the
    time between two calls, so after the first looks they are spaced out beyond one in sixteen."""
    logits = trained_logits(64)
    labels = torch.randint(0, 10, (64,))
    looks = looks_of(*[lambda: F.cross_entropy(logits, labels)] * (torch_calls.COUNTED_CALLS + 16 * 10))
    assert torch_calls.COUNTED_CALLS + 1 <= len(looks) < torch_calls.COUNTED_CALLS + 10


def label_looks(batches: Iterable[torch.Tensor], classes: int = 10) -> list[LossLook]:
    logits = trained_logits(1, classes).detach().requires_grad_()
    return looks_of(*[lambda y=y: F.cross_entropy(logits.expand(len(y), classes), y) for y in batches])


def test_a_constant_label_stream_is_named_once_1400_labels_are_in() -> None:
    detector = SingleClassLabels()
    looks = label_looks([torch.zeros(64, dtype=torch.long)] * 22)
    assert detector.observe_loss_calls(21, looks[:21]) == []  # 1,344 labels
    [finding] = detector.observe_loss_calls(22, looks[21:])
    assert finding.details["label_counts"] == {0: 22 * 64} and finding.details["classes"] == 10


def test_rare_positives_and_token_targets_are_not_a_constant_stream() -> None:
    g = torch.Generator().manual_seed(3)
    rare = [(torch.rand(16, generator=g) < 0.05).long() for _ in range(200)]
    assert SingleClassLabels().observe_loss_calls(200, label_looks(rare, classes=2)) == []
    tokens = torch.zeros(8, 200, dtype=torch.long)  # one label per token: left alone
    logits = torch.randn(8, 10, 200, requires_grad=True)
    assert SingleClassLabels().observe_loss_calls(1, looks_of(lambda: F.cross_entropy(logits, tokens))) == []


def test_batches_each_of_one_class_from_a_mixed_stream_are_named_after_the_first_block() -> None:
    blocks = [torch.full((16,), k) for k in range(10) for _ in range(4)]
    detector, fired = ClassSortedBatches(), None
    for step, look in enumerate(label_looks(blocks), start=1):
        if detector.observe_loss_calls(step, [look]) and fired is None:
            fired = step
    assert fired == 6, "block 0 is batches 1-4: the second class comes with batch 5"


@pytest.mark.parametrize("stream", ["5 % positives", "batches of 2", "batches of 4"])
def test_one_class_batches_that_shuffling_explains_are_quiet(stream: str) -> None:
    g = torch.Generator().manual_seed(4)
    if stream == "5 % positives":
        batches, classes = [(torch.rand(8, generator=g) < 0.05).long() for _ in range(400)], 2
    else:
        size = int(stream.split()[-1])
        batches, classes = [torch.randint(0, 10, (size,), generator=g) for _ in range(400)], 10
    detector = ClassSortedBatches()
    assert [f for look in label_looks(batches, classes) for f in detector.observe_loss_calls(1, [look])] == []


def test_the_tail_of_one_class_batches_is_the_binomial_one_when_the_chances_are_equal() -> None:
    assert poisson_binomial_tail([0.3] * 10, 4) == pytest.approx(
        sum(math.comb(10, k) * 0.3**k * 0.7 ** (10 - k) for k in range(4, 11)))
    assert poisson_binomial_tail([0.5, 0.5], 0) == 1.0


def test_a_language_models_logits_are_read_in_sampled_rows() -> None:
    """(tokens, vocabulary) logits: a few whole rows are read (at most 64 Ki values), which is
    enough for a row that sums to 1."""
    logits = torch.randn(2048, 1000, requires_grad=True)
    tokens = torch.randint(0, 1000, (2048,))
    [look] = looks_of(lambda: F.cross_entropy(logits.softmax(1), tokens))
    assert look.input.shape == (2048, 1000) and sum(look.labels or ()) == 2048
    assert [m.problem for m in mismatches(look)] == ["probabilities_as_logits"]


def test_on_the_cpu_a_look_is_measured_when_read_from_what_the_loss_call_saw() -> None:
    """The training thread only keeps the tensors (a copy of a big input's sampled rows, so that
    the look holds none of it); the step worker measures them when it reads the look, and gets
    the numbers of the call even when the input has been overwritten and let go by then."""
    watch = torch_calls.watch(lambda classes, entropy: None)
    try:
        weights = torch.full((2048, 1000), -5.0)
        weights[:, 3] = 5.0
        logits = weights.requires_grad_(True) * 1.0
        F.cross_entropy(logits, torch.full((2048,), 3))
        [pending] = watch.take_looks()
        with torch.no_grad():
            logits.fill_(100.0)  # the loop moves on before the worker reads the look
        del logits
        look = watch.read(pending)
    finally:
        torch_calls.unwatch(watch)
    assert (look.input.min, look.input.max) == (-5.0, 5.0)
    assert look.labels is not None and look.labels[3] == 2048 and sum(look.labels) == 2048
