"""Framework callbacks: a tiny GPT-2 really trained on the CPU by the Hugging Face Trainer and by
Lightning, each watched by its ``TuimonCallback``, recorded, and read back from the recording.

Each test skips, saying which package is missing, where its framework is not installed (``make
test`` installs them; elsewhere ``pip install -e '.[transformers,lightning]'`` in the repository).
The model is built from a local config (nothing is downloaded); the data are learnable token
sequences made here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
import torch
from helpers.cli import SCRIPTS, tuimon_run_command
from helpers.recordings import of_type, read_messages
from helpers.tiny_lm import LmRows, tiny_gpt2, token_rows

from publisher.integrations.session import AUTOSTART_ENV
from publisher.wire.recorder import read_recording

VOCAB, LENGTH = 64, 16
ALARMS = ("warning", "critical")
QUIET = {"gpu": "none"}


def recorded(path: Path) -> list[dict[str, Any]]:
    """A recording's messages, through the recording reader (every line must decode)."""
    found = []
    for number, _, message in read_recording(path):
        assert isinstance(message, dict), f"line {number}: {message}"
        found.append(message)
    return found


def kinds(msgs: list[dict[str, Any]], severities: tuple[str, ...] = ALARMS) -> list[str]:
    return sorted({m["kind"] for m in of_type(msgs, "event") if m["severity"] in severities})


def assert_healthy_run(msgs: list[dict[str, Any]], steps: int, rank: int = 0, world_size: int = 1) -> None:
    start = of_type(msgs, "run_start")[0]
    assert (start["rank"], start["world_size"]) == (rank, world_size)
    metrics = of_type(msgs, "metrics")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), "one step per optimizer step"
    assert all("loss" in m["metrics"] and "lr" in m["metrics"] for m in metrics)
    assert any("grad_norm" in m["metrics"] for m in metrics)
    assert metrics[-1]["metrics"]["samples_per_s"] > 0
    assert kinds(msgs) == [], "a healthy run raises no warning or critical event"
    assert of_type(msgs, "run_end")[-1]["status"] == "completed"


# ------------------------------------------------------------------------------- transformers


@pytest.fixture
def hf() -> ModuleType:
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate: pip install -e '.[transformers]'")
    return pytest.importorskip("transformers", reason="pip install -e '.[transformers]'")


def hf_train(hf: ModuleType, tmp_path: Path, *, steps: int, accumulation: int = 1,
             optimizer: Any = None, model: Any = None) -> Any:
    """Train the tiny GPT-2 ``steps`` optimizer steps, evaluating every 5, watched and recorded in
    ``tmp_path / "hf.jsonl"`` (``hf.rank<R>.jsonl`` with several ranks); returns the Trainer."""
    from publisher.integrations.transformers import TuimonCallback

    model = model or tiny_gpt2()
    args = hf.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=accumulation, learning_rate=3e-3, logging_steps=1,
        eval_strategy="steps", eval_steps=5, per_device_eval_batch_size=8, save_strategy="no",
        report_to=[], dataloader_num_workers=0, use_cpu=True, disable_tqdm=True, seed=0,
    )
    callback = TuimonCallback(record=tmp_path / "hf.jsonl", **QUIET)
    trainer = hf.Trainer(model=model, args=args, train_dataset=LmRows(token_rows(256)),
                         eval_dataset=LmRows(token_rows(16, seed=1)), callbacks=[callback],
                         optimizers=(optimizer, None))
    trainer.train()
    assert callback.monitor is None, "closed at the end of training"
    return trainer


@pytest.mark.parametrize("accumulation", [1, 4])
def test_trainer_steps_losses_and_evaluation(hf: ModuleType, tmp_path: Path, accumulation: int) -> None:
    trainer = hf_train(hf, tmp_path, steps=40 if accumulation == 1 else 16, accumulation=accumulation)
    msgs = recorded(tmp_path / "hf.jsonl")
    steps = trainer.state.global_step
    assert_healthy_run(msgs, steps)
    assert of_type(msgs, "run_start")[0]["config"]["gradient_accumulation_steps"] == accumulation
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    assert sorted(logged) == list(range(1, steps + 1))
    assert any("eval_loss" in entry for entry in trainer.state.log_history), "evaluation ran"
    for m in of_type(msgs, "metrics"):
        ours, theirs = m["metrics"], logged[m["step"]]
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5), f"step {m['step']}"
        assert ours["lr"] == pytest.approx(theirs["learning_rate"], rel=1e-6)
    assert of_type(msgs, "metrics")[-1]["metrics"]["tokens_per_s"] > 0


def test_trainer_with_an_optimizer_over_the_frozen_backbone_is_reported(
    hf: ModuleType, tmp_path: Path
) -> None:
    """Fine-tuning the head on a frozen backbone, with the backbone's parameters handed to the
    optimizer by mistake: every step is a no-op and the head never trains."""
    model = tiny_gpt2(tied=False)
    model.transformer.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.transformer.parameters(), lr=1e-3)
    hf_train(hf, tmp_path, steps=8, optimizer=optimizer, model=model)
    msgs = recorded(tmp_path / "hf.jsonl")
    assert "optimizer_noop" in kinds(msgs)
    assert "unowned_parameters" in kinds(msgs, ("info",)), "the head is trainable but no optimizer owns it"


def test_callback_stands_aside_under_tuimon_run(hf: ModuleType, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`tuimon run` watches the process through PyTorch's hooks already: one Monitor, not two."""
    monkeypatch.setenv(AUTOSTART_ENV, "1")
    hf_train(hf, tmp_path, steps=2)
    assert not (tmp_path / "hf.jsonl").exists()


def test_unknown_monitor_option_is_refused_when_the_callback_is_made(hf: ModuleType) -> None:
    from publisher.integrations.transformers import TuimonCallback

    with pytest.raises(TypeError, match="recrod"):
        TuimonCallback(recrod="run.jsonl")


def accelerate_launch(processes: int) -> list[str]:
    """``accelerate launch`` of ``processes`` workers on this machine's CPU. Accelerate starts several
    processes through ``torch.distributed.run`` only in its multi-device mode; ``--cpu`` runs a single
    one. Every choice is given, so that it asks nothing and warns of no default."""
    return [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes",
            str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def test_trainer_under_accelerate_launch_records_each_rank(hf: ModuleType, tmp_path: Path) -> None:
    """Two data-parallel processes (gloo) started by `accelerate launch`, each with its callback
    (this file's ``__main__``)."""
    result = subprocess.run(
        [*accelerate_launch(2), __file__, str(tmp_path), "6"], capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    runs = set()
    for rank in (0, 1):
        msgs = recorded(tmp_path / f"hf.rank{rank}.jsonl")
        assert_healthy_run(msgs, 6, rank=rank, world_size=2)
        runs.add(of_type(msgs, "run_start")[0]["run"])
    assert len(runs) == 1, "every rank reports the same run"


def test_tuimon_run_wraps_accelerate_launch(tmp_path: Path) -> None:
    """`tuimon run -- accelerate launch` works as it does with torchrun: one recording per worker."""
    pytest.importorskip("accelerate", reason="pip install -e '.[transformers]'")
    command = [*accelerate_launch(2), str(SCRIPTS / "plain_accelerate_ddp.py"), "8"]
    result, recordings = tuimon_run_command(tmp_path, command, run="acc")
    assert result.returncode == 0, result.stderr
    assert len(recordings) == 2, "one recording per training process, none for the launchers"
    starts = [of_type(read_messages(path), "run_start")[0] for path in recordings]
    assert sorted(s["rank"] for s in starts) == [0, 1]
    assert {(s["run"], s["world_size"]) for s in starts} == {("acc", 2)}
    for path in recordings:
        assert [m["step"] for m in of_type(read_messages(path), "metrics")] == list(range(1, 9))


# ---------------------------------------------------------------------------------- lightning


class Lightning(NamedTuple):
    """A Lightning package (``lightning.pytorch`` or ``pytorch_lightning``) and its TuimonCallback."""

    package: ModuleType
    callback: type


def lightning_named(name: str) -> Lightning:
    pytest.importorskip("transformers", reason="the tiny GPT-2 needs transformers")
    if name == "lightning":
        pytest.importorskip("lightning", reason="pip install -e '.[lightning]'")
        import lightning.pytorch as package

        from publisher.integrations.lightning import TuimonCallback
    else:
        package = pytest.importorskip("pytorch_lightning", reason="pip install -e '.[pytorch-lightning]'")
        from publisher.integrations.pytorch_lightning import TuimonCallback  # type: ignore[assignment]
    return Lightning(package, TuimonCallback)


def lightning_train(pl: Lightning, tmp_path: Path, *, steps: int, accumulation: int = 1, manual: bool = False,
                    detached_backbone: bool = False, fail_at: int = -1) -> tuple[Any, list[dict[str, Any]]]:
    """Fit the tiny GPT-2 for ``steps`` optimizer steps, validating every 5 batches, watched and
    recorded; returns the module (its ``losses``: every training batch's) and the recording.
    ``detached_backbone``: the bug of a head trained on detached features (cached activations, a
    stray ``.detach()``): the transformer below it never gets a gradient. ``fail_at``: the training
    step of that batch index raises."""

    class TinyLM(pl.package.LightningModule):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters({"manual": manual, "accumulation": accumulation})
            self.automatic_optimization = not manual
            self.model = tiny_gpt2()
            self.losses: list[float] = []

        def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
            if index == fail_at:
                raise ValueError("boom")
            if detached_backbone:
                features = self.model.transformer(input_ids=batch).last_hidden_state.detach()
                logits = self.model.lm_head(features)[:, :-1]
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            else:
                loss = self.model(input_ids=batch, labels=batch).loss
            self.losses.append(loss.item())
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            return loss

        def validation_step(self, batch: torch.Tensor, index: int) -> None:
            self.log("val_loss", self.model(input_ids=batch, labels=batch).loss)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    module = TinyLM()
    trainer = pl.package.Trainer(
        max_steps=steps, accumulate_grad_batches=accumulation, accelerator="cpu", devices=1,
        val_check_interval=5, limit_val_batches=2, num_sanity_val_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[pl.callback(run="pl", record=tmp_path / "pl.jsonl", **QUIET)],
    )
    loader = torch.utils.data.DataLoader(token_rows(512), batch_size=4)
    trainer.fit(module, loader, torch.utils.data.DataLoader(token_rows(16, seed=1), batch_size=8))
    return module, recorded(tmp_path / "pl.jsonl")


@pytest.mark.parametrize(("name", "accumulation", "manual"), [
    ("lightning", 1, False), ("lightning", 4, False), ("lightning", 1, True), ("pytorch_lightning", 1, False),
])
def test_lightning_steps_losses_and_validation(
    tmp_path: Path, name: str, accumulation: int, manual: bool
) -> None:
    pl = lightning_named(name)
    steps = 30
    module, msgs = lightning_train(pl, tmp_path, steps=steps, accumulation=accumulation, manual=manual)
    assert_healthy_run(msgs, steps)
    assert of_type(msgs, "run_start")[0]["config"] == {"manual": manual, "accumulation": accumulation}
    batches = torch.tensor(module.losses[: steps * accumulation]).reshape(steps, accumulation)
    for m, expected in zip(of_type(msgs, "metrics"), batches.mean(dim=1).tolist(), strict=True):
        assert m["metrics"]["loss"] == pytest.approx(expected, rel=1e-5), f"step {m['step']}"


def test_lightning_with_a_backbone_cut_off_from_the_graph_is_reported(tmp_path: Path) -> None:
    _, msgs = lightning_train(lightning_named("lightning"), tmp_path, steps=8, detached_backbone=True)
    assert kinds(msgs) == ["missing_gradient"]
    event = next(m for m in of_type(msgs, "event") if m["kind"] == "missing_gradient")
    assert "model.transformer.h.0" in event["message"] and "wte" not in event["message"], (
        "the blocks below the head are named; the embedding tied to the head does get gradients")


def test_lightning_failure_is_recorded(tmp_path: Path) -> None:
    """An exception inside fit() closes the Monitor with the error (Lightning's on_exception)."""
    pl = lightning_named("lightning")
    with pytest.raises(ValueError, match="boom"):
        lightning_train(pl, tmp_path, steps=8, fail_at=3)
    end = of_type(recorded(tmp_path / "pl.jsonl"), "run_end")[-1]
    assert (end["status"], end["step"]) == ("failed", 3)
    assert "ValueError: boom" in end["error"]


if __name__ == "__main__":  # a worker of test_trainer_under_accelerate_launch_records_each_rank
    import transformers

    hf_train(transformers, Path(sys.argv[1]), steps=int(sys.argv[2]))
