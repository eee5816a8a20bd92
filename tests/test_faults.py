"""The fault-injection and healthy suites, end to end: real scripts, real Monitor, real recordings.

Every script in tests/faults/ is a small real CPU training loop (see tests/faults/_harness.py).
Here they run as real subprocesses watched by the real :class:`~publisher.monitor.Monitor`
(detectors, per-layer samples and invariants on, publishing over ZeroMQ with a JSON Lines
recording); the assertions read the recordings only. A fault script must raise its expected event
kind within its allowed number of steps (or seconds) after the trigger and no alarm before it; a
healthy script must raise no warning and no critical event at all. Some scripts also run unmodified
under ``tuimon run`` (zero-code mode) and must be caught the same way.

Detection delay is measured from the recordings, in steps and seconds, and
printed as a table (``pytest -s``, and in failure messages): once with every cost budget pinned,
once for the mid-run faults on steps of 10 ms or more with the Monitor's default budgets, where
the targets must hold. By hand: ``python tests/faults/_harness.py --table [--defaults]``.

To keep the suite short on two cores, two processes run the single-process scripts one after the
other, side by side, then one pair of gloo processes runs all the 2-process ones (Python and torch
start once per process, not once per script).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fault_batches import FAULTS, h, harness_env, run_batches

from publisher.wire.event_kinds import EVENT_KINDS

SCRIPTS = sorted(p.stem for p in FAULTS.glob("*.py") if p.stem.startswith(("fault_", "healthy_")))
FAULT_CASES = [name for name in SCRIPTS if name.startswith("fault_")]
HEALTHY_CASES = [name for name in SCRIPTS if name.startswith("healthy_")]
#: The faults the targets are stated for with the default budgets: mid-run, steps >= 10 ms.
PACED_MID_RUN = [name for name in FAULT_CASES
                 if h._load(name).trigger > 0 and (h._load(name).step_s or 0.0) >= 0.01]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run every script once, in subprocesses; returns the folder of their recordings."""
    return run_batches(tmp_path_factory.mktemp("faults"), SCRIPTS, timeout=170)


@pytest.fixture(scope="module")
def defaults_suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The mid-run faults on steps of 10 ms or more again, on the Monitor's default budgets (no
    pinned sampling budgets, memory every 0.1 s): their recordings' folder and delay table."""
    out = run_batches(tmp_path_factory.mktemp("faults-defaults"), PACED_MID_RUN, "--defaults", timeout=120)
    table, _ = h.tabulate(PACED_MID_RUN, out, defaults=True)
    print("\n" + table)
    return out, table


def _case(name: str) -> h.Case:
    return h._load(name)


def test_the_suite_covers_the_bug_classes() -> None:
    expected = {kind for name in FAULT_CASES for kind in _case(name).expect}
    assert {
        "nonfinite_loss", "update_ratio", "grad_explosion", "vanishing_gradient", "dead_activations",
        "data_bottleneck", "throughput_drop", "memory_growth", "loss_plateau",  # detectors
        "chance_loss", "duplicate_batches", "lr_vanished",
        "optimizer_noop", "stale_gradients", "missing_gradient", "eval_mode_training",  # invariants
        "replica_divergence", "frozen_param_changed", "tie_broken", "clip_noop", "unowned_tensors",
        "loss_input_mismatch", "single_class_labels", "class_sorted_batches",  # the loss call's tensors
        "nonfinite_origin",  # the step re-run
    } <= expected
    assert len(HEALTHY_CASES) >= 25
    assert {"fault_debug_slowdown", "fault_kept_graph_leak", "fault_eval_after_validation",
            "fault_tie_broken_mid_run"} <= set(PACED_MID_RUN)


@pytest.mark.parametrize("name", FAULT_CASES)
def test_fault_is_caught_soon_after_its_trigger(suite: Path, name: str) -> None:
    case = _case(name)
    recordings = h.recordings_of(name, case.world_size, suite)
    verdict = h.judge(case, recordings)
    assert verdict.passed, verdict.problems
    for kind in case.expect:
        event = next(e for r in recordings for e in r.events(kind) if e["step"] >= case.first_faulty_step)
        assert event["severity"] == EVENT_KINDS[kind].default_severity
        details = event["details"]
        # The explanation: where (step, rank) and how to reproduce it, for every kind.
        assert details["replay"]["step"] == event["step"] and details["replay"]["rank"] == event["rank"]
        assert details["replay"]["run"] == name
        assert event["message"] and isinstance(event["count"], int)


@pytest.mark.parametrize(("name", "module", "phase", "reproduced"), [
    ("fault_nonfinite_forward", "Net.attn", "forward", True),
    ("fault_nonfinite_backward", "Net.scale", "backward", True),
    ("fault_nonfinite_glitch", None, "forward", False),
    ("fault_ddp_nonfinite", "Net.attn", "forward", True),
])
def test_nonfinite_origin_names_the_module_the_phase_and_whether_it_reproduced(
        suite: Path, name: str, module: str | None, phase: str, reproduced: bool) -> None:
    """With the model given (without it: ``test_nonfinite.py``), on every rank, with its bundle."""
    case = _case(name)
    for recording in h.recordings_of(name, case.world_size, suite):
        [event] = recording.events("nonfinite_origin")
        origin = event["details"]["origin"]
        assert (origin["module"], origin["phase"], origin["reproduced"]) == (module, phase, reproduced), name
        assert event["step"] == case.first_faulty_step
        assert Path(event["details"]["repro"]).is_file(), "the repro bundle lies next to the recording"


@pytest.mark.parametrize("name", HEALTHY_CASES)
def test_healthy_run_raises_no_alarm(suite: Path, name: str) -> None:
    case = _case(name)
    recordings = h.recordings_of(name, case.world_size, suite)
    verdict = h.judge(case, recordings)
    assert verdict.passed, verdict.problems
    for recording in recordings:
        assert recording.metrics(), "the run was watched: its steps are in the recording"
        final = h.final_statuses(recording)
        assert not [name for name, state in final.items() if state["status"] == "violated"]
        assert final["params_receive_grads"]["status"] == "ok", "the invariants checked something"


def test_detector_events_say_what_was_seen_and_why(suite: Path) -> None:
    """Numbers seen, where (names, step, rank), likely causes: what a user needs to start looking."""
    checks = {
        "fault_nan_loss": ("nonfinite_loss", "nonfinite_grads"),
        "fault_lr_jump": ("update_ratio", "params"),
        "fault_exploding_gradients": ("grad_explosion", "baseline"),
        "fault_vanishing_gradients": ("vanishing_gradient", "first_layer"),
        "fault_dead_relu": ("dead_activations", "modules"),
        "fault_slow_input_pipeline": ("data_bottleneck", "data_share"),
        "fault_throughput_drop": ("throughput_drop", "before"),
        "fault_memory_leak": ("memory_growth", "bytes_per_step"),
        "fault_shuffled_labels": ("loss_plateau", "reference_loss"),
        "fault_softmax_cross_entropy": ("loss_input_mismatch", "call_site"),
        "fault_constant_labels": ("single_class_labels", "label_counts"),
        "fault_class_sorted_batches": ("class_sorted_batches", "recent_batches"),
        "fault_lr_below_resolution": ("lr_vanished", "params"),
    }
    for name, (kind, key) in checks.items():
        [recording] = h.recordings_of(name, 1, suite)
        event = recording.events(kind)[0]
        details = event["details"]
        assert details[key] is not None, (name, details)
        assert details["likely_causes"] and details["step"] >= 1 and details["rank"] == 0, name
    [softmax] = h.recordings_of("fault_softmax_cross_entropy_cnn", 1, suite)
    details = softmax.events("loss_input_mismatch")[0]["details"]
    seen = (details["function"], details["input_made_by"], details["input_shape"])
    assert seen == ("cross_entropy", "Softmax", [32, 10])
    assert details["call_site"].startswith(str(FAULTS / "_harness.py:")), "the line that called the loss"
    [constant] = h.recordings_of("fault_constant_labels", 1, suite)
    details = constant.events("single_class_labels")[0]["details"]
    assert details["label_counts"] == {"0": details["labels_seen"]} and details["classes"] == 10
    [ordered] = h.recordings_of("fault_class_sorted_batches", 1, suite)
    details = ordered.events("class_sorted_batches")[0]["details"]
    assert details["single_class_batches"] >= 0.8 * details["batches_looked_at"]
    assert details["classes_seen"] >= 2
    # What set it off (the event keeps its first finding): chance under shuffling below the
    # detector's alpha, and far fewer one-class batches expected than were seen.
    assert details["p_value"] < 1e-9 and 0 < len(details["recent_batches"]) <= 8  # the last ones seen
    assert details["expected_if_shuffled"] < details["single_class_batches"] / 100
    [nan] = h.recordings_of("fault_nan_loss", 1, suite)
    [event] = nan.events("nonfinite_loss")
    assert event["details"]["nonfinite_grads"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert event["count"] == 3, "two bursts of NaN batches close together: one episode"
    [dead] = h.recordings_of("fault_dead_relu", 1, suite)
    assert {"1", "3"} <= set(dead.events("dead_activations")[0]["details"]["modules"]), "both ReLU layers"
    [vanishing] = h.recordings_of("fault_vanishing_gradients", 1, suite)
    details = vanishing.events("vanishing_gradient")[0]["details"]
    assert (details["first_layer"], details["last_layer"]) == ("0.weight", "22.weight")
    assert details["first_to_last"] < 1e-3


def tuimon_run(tmp_path: Path, script: str, *options: str) -> list[h.Recording]:
    prefix = tmp_path / "rec" / "run"
    done = subprocess.run(
        [sys.executable, "-m", "tuimon.cli", "run", "--run", script, "--record", str(prefix), "--gpu", "none",
         *options, "--", sys.executable, str(FAULTS / f"{script}.py"), "--plain"],
        capture_output=True, text=True, timeout=120, env=harness_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    paths = sorted(prefix.parent.glob("run.rank*.jsonl"))
    assert len(paths) == 1, paths
    return [h.Recording.from_jsonl(paths[0])]


@pytest.mark.parametrize("script", ["fault_nan_loss", "fault_missing_zero_grad", "fault_vanishing_gradients",
                                    "fault_unregistered_layers", "fault_lr_stepped_per_batch",
                                    "fault_softmax_cross_entropy_cnn", "fault_class_sorted_batches"])
def test_an_unmodified_script_under_tuimon_run_is_caught_the_same_way(
    suite: Path, tmp_path: Path, script: str
) -> None:
    case = _case(script)
    zero_code = h.judge(case, tuimon_run(tmp_path, script))
    assert zero_code.passed, zero_code.problems
    watched = h.judge(case, h.recordings_of(script, 1, suite))
    for kind, delay in watched.delays.items():
        # tuimon run builds its Monitor inside the first optimizer step: one step later at most.
        assert delay is not None and zero_code.delays[kind] in (delay, delay + 1), (kind, zero_code.delays)


def test_repeated_batches_said_to_be_deliberate_on_tuimon_run_are_not_reported(tmp_path: Path) -> None:
    case = _case("fault_same_worker_seed")
    assert h.judge(case, tuimon_run(tmp_path / "plain", case.name)).passed
    [deliberate] = tuimon_run(tmp_path / "deliberate", case.name, "--repeated-batches")
    assert deliberate.metrics() and not deliberate.events("duplicate_batches")


def test_healthy_script_under_tuimon_run_stays_quiet(tmp_path: Path) -> None:
    recordings = tuimon_run(tmp_path, "healthy_gan")
    verdict = h.judge(_case("healthy_gan"), recordings)
    assert verdict.passed, verdict.problems
    assert len(recordings[0].metrics()) == 30, "one metrics message per generator-and-discriminator step"


def test_detection_delays_are_measured_and_tabled(suite: Path) -> None:
    """Every fault case's trigger is marked once per rank, at its first faulty step, so its delay is
    known in seconds as well as steps; the table of delays (budgets pinned) goes to the log."""
    table, _ = h.tabulate(FAULT_CASES, suite)
    print("\n" + table)
    for name in FAULT_CASES:
        case = _case(name)
        try:
            recordings = h.recordings_of(name, case.world_size, suite)
        except RuntimeError:
            continue  # a crashed case fails its own test, with its traceback
        marks = [e["step"] for r in recordings for e in r.events(h.TRIGGER_KIND)]
        assert marks == [case.first_faulty_step] * case.world_size, (name, marks)
        verdict = h.judge(case, recordings)
        for kind, steps in verdict.delays.items():
            assert steps is None or verdict.seconds[kind] is not None, (name, kind, table)


@pytest.mark.parametrize("name", PACED_MID_RUN)
def test_mid_run_fault_is_caught_in_time_with_default_budgets(defaults_suite: tuple[Path, str],
                                                              name: str) -> None:
    """The detection-delay targets as a user meets them: default budgets, steps of 10 ms or more."""
    out, table = defaults_suite
    case = _case(name)
    verdict = h.judge(case, h.recordings_of(name, case.world_size, out))
    assert verdict.passed, f"{verdict.problems}\n{table}"
