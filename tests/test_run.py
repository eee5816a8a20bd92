"""`tuimon run`: an unmodified PyTorch script, launched as a real subprocess, is monitored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import SCRIPTS, TUIMON, tuimon_run_command
from helpers.recordings import of_type, read_messages


def tuimon_run(tmp_path: Path, *script_args: str, run: str = "plain", script: str = "plain_train.py",
               options: tuple[str, ...] = ()):
    return tuimon_run_command(tmp_path, [sys.executable, str(SCRIPTS / script), *script_args], run=run,
                              options=options)


def test_plain_script_is_monitored_without_code_change(tmp_path: Path) -> None:
    result, recordings = tuimon_run(tmp_path, "--steps", "60")
    assert result.returncode == 0, result.stderr
    assert len(recordings) == 1 and ".rank0." in recordings[0].name
    msgs = read_messages(recordings[0])
    start = of_type(msgs, "run_start")[0]
    assert start["run"] == "plain" and start["rank"] == 0
    assert any(arg.endswith("plain_train.py") for arg in start["argv"])
    metrics = of_type(msgs, "metrics")
    assert [m["step"] for m in metrics] == list(range(1, 61))
    losses = [m["metrics"]["loss"] for m in metrics]
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10]), "the loss of this regression task falls"
    later = metrics[-1]["metrics"]
    assert later["lr"] == pytest.approx(0.05)
    grad_norms = [m["metrics"]["grad_norm"] for m in metrics if "grad_norm" in m["metrics"]]
    assert grad_norms and min(grad_norms) > 0, (
        "the gradient norm is measured (on a CPU: when its budget allows)"
    )
    assert later["data_time"] > 0, "time waiting on the DataLoader is measured"
    assert later["samples_per_s"] > 0, "batch size is read from the DataLoader"
    assert of_type(msgs, "run_end")[-1]["status"] == "completed"


def test_an_optimizer_subclass_calling_super_step_counts_each_step_once(tmp_path: Path) -> None:
    result, recordings = tuimon_run(tmp_path, "--steps", "20", "--subclass")
    assert result.returncode == 0, result.stderr
    assert [m["step"] for m in of_type(read_messages(recordings[0]), "metrics")] == list(range(1, 21))


def test_backward_without_an_optimizer_keeps_bounded_state(tmp_path: Path) -> None:
    """Manual updates never step an optimizer: no Monitor starts, and losses are not hoarded."""
    from publisher.autohook.hooks import MAX_PENDING_LOSSES

    result, recordings = tuimon_run(tmp_path, script="manual_updates.py")
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == MAX_PENDING_LOSSES
    assert recordings == [], "nothing trained through an optimizer, so nothing is published"


def test_exit_status_is_the_commands(tmp_path: Path) -> None:
    result, _ = tuimon_run(tmp_path, "--steps", "5", "--exit-code", "3")
    assert result.returncode == 3


def test_crash_is_recorded_as_failed(tmp_path: Path) -> None:
    result, recordings = tuimon_run(tmp_path, "--steps", "50", "--raise-at", "7")
    assert result.returncode == 1
    assert "RuntimeError: boom" in result.stderr
    end = of_type(read_messages(recordings[0]), "run_end")[-1]
    assert end["status"] == "failed" and "boom" in end["error"]
    assert end["step"] == 7


def test_nan_loss_is_detected_without_code_change(tmp_path: Path) -> None:
    result, recordings = tuimon_run(tmp_path, "--steps", "30", "--nan-at", "12")
    assert result.returncode == 0, result.stderr
    events = [e for e in of_type(read_messages(recordings[0]), "event") if e["kind"] == "nonfinite_loss"]
    assert events, "a NaN loss raises a nonfinite_loss event"
    assert events[0]["severity"] == "critical"
    assert 12 <= events[0]["step"] <= 13


@pytest.mark.parametrize("launcher", ["mp.spawn", "torchrun"])
def test_every_training_process_reports_its_own_rank(tmp_path: Path, launcher: str) -> None:
    if launcher == "mp.spawn":
        command = [sys.executable, str(SCRIPTS / "plain_spawn_ddp.py"), str(tmp_path / "dist-init"), "8"]
    else:
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        command = [
            torchrun,
            "--standalone",
            "--nproc_per_node",
            "2",
            str(SCRIPTS / "plain_torchrun_ddp.py"),
            "8",
        ]
    result, recordings = tuimon_run_command(tmp_path, command, run="ddp")
    assert result.returncode == 0, result.stderr
    assert len(recordings) == 2, "one recording per training process, none for the launcher"
    starts = [of_type(read_messages(path), "run_start")[0] for path in recordings]
    assert sorted(s["rank"] for s in starts) == [0, 1]
    assert {s["run"] for s in starts} == {"ddp"}
    assert all(s["world_size"] == 2 for s in starts)
    for path in recordings:
        assert len(of_type(read_messages(path), "metrics")) == 8


def test_a_python_without_tuimon_runs_unmonitored_and_is_told_how_to_fix_it(tmp_path: Path) -> None:
    """The script's interpreter is another environment's (a venv without tuimon): the program still
    runs, and one line names the Python to use instead and the command that installs tuimon there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "other")], check=True)
    other = tmp_path / "other" / "bin" / "python"
    result, recordings = tuimon_run_command(tmp_path, [str(other), "-c", "print('trained')"], run="other")
    assert result.returncode == 0 and result.stdout == "trained\n" and recordings == []
    line, summary = result.stderr.splitlines()
    assert "without starting a publisher" in summary
    assert line.startswith(f"tuimon: not monitoring this process: {other} cannot import tuimon's publisher")
    root = Path(__file__).resolve().parents[1]
    assert line.endswith(f"run the program with {sys.executable}, or install tuimon into its environment: "
                         f"{other} -m pip install -e {root}")


def test_missing_command_is_a_one_line_error(tmp_path: Path) -> None:
    result = subprocess.run([*TUIMON, "run", "--", "no-such-program-xyz"], capture_output=True, text=True)
    assert result.returncode == 2
    assert (
        result.stderr.strip() == "tuimon: error: command not found: 'no-such-program-xyz' "
        "(check the name or give its full path)"
    )


def test_the_run_says_how_it_ended_and_fail_on_makes_a_critical_event_an_exit_status(tmp_path: Path) -> None:
    """A script with a learning rate made 100x too large at step 150 and a ``-log(softmax)`` that
    reaches ``log(0)``: it exits 0 on non-finite weights, as such scripts do. ``tuimon run`` says
    the steps, the events by severity with the first critical one, where the recording and the
    repro bundle went and how to replay it; ``--fail-on critical`` turns that into exit status 3."""
    from tuimon.commands.run import FAILED_ON_EVENTS
    from tuimon.sources.replay import load_recordings

    result, recordings = tuimon_run(tmp_path, script="plain_lr_jump_log0.py", run="lrjump",
                                    options=("--fail-on", "critical"))
    assert result.returncode == FAILED_ON_EVENTS, result.stderr
    said = [line.removeprefix("tuimon: ") for line in result.stderr.splitlines()
            if line.startswith("tuimon: ")]
    assert said[0].startswith("run lrjump ended (exit status 0) after 300 steps in"), said
    [events] = [line for line in said if line.startswith("events: ")]
    assert "critical" in events, said
    [first] = [line for line in said if line.startswith("  the first critical: ")]
    messages = read_messages(recordings[0])
    criticals = [m for m in of_type(messages, "event") if m["severity"] == "critical"]
    earliest = min(criticals, key=lambda m: m["step"])
    assert f"{earliest['kind']} at step {earliest['step']:,} on rank 0: " in first, (first, earliest)
    prefix = str(tmp_path / "rec" / "exp")
    assert f"recording: {recordings[0]}" in said and f"  replay it: tuimon replay {prefix}" in said, said
    bundles = [line.split()[-1] for line in said if line.startswith("repro bundle: tuimon repro show ")]
    assert bundles and all(Path(bundle).is_file() for bundle in bundles), said
    assert said[-1].startswith(f"exit status {FAILED_ON_EVENTS}: the run raised a critical event"), said
    assert load_recordings([prefix]).names == [recordings[0].name], "replay takes the prefix named"


def test_a_command_that_never_trains_is_said_to_have_started_no_publisher(tmp_path: Path) -> None:
    result, recordings = tuimon_run_command(tmp_path, [sys.executable, "-c", "print('hello')"], run="none",
                                            options=("--fail-on", "warning"))
    assert result.returncode == 0 and recordings == []
    assert "without starting a publisher" in result.stderr, result.stderr
