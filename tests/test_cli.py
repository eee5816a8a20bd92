"""The viewer's commands as a user runs them: real `tuimon` processes, on a real terminal (pty)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers.cli import TUIMON, Terminal

from tuimon.ui.terminal import HANGUP_GRACE_S

#: A closed terminal must end the dashboard within this many seconds.
HANGUP_EXIT_S = 5.0


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TUIMON, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuimon: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_watch_with_a_bad_endpoint_says_so_in_one_line() -> None:
    result = run_cli("watch", "bad::endpoint")
    assert_one_line_error(result, "bad endpoint 'bad::endpoint'", "e.g. tcp://127.0.0.1:5555")


def test_replay_of_a_missing_file_says_what_was_looked_for_in_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    assert_one_line_error(run_cli("replay", str(gone)),
                          f"no recording {gone}: no such file, no {gone}.rank*.jsonl")


def test_replay_takes_a_file_a_record_prefix_or_a_folder(recording: Path) -> None:
    """The three ways a recording is named, the same in every command (tuimon.sources.recording_files)."""
    from tuimon.sources.replay import load_recordings

    prefix = recording.parent / "runs" / "exp1"
    prefix.parent.mkdir()
    for rank in (0, 1):
        (prefix.parent / f"exp1.rank{rank}.pid{40 + rank}.jsonl").write_bytes(recording.read_bytes())
    assert load_recordings([recording]).names == [recording.name]
    assert load_recordings([prefix]).names == ["exp1.rank0.pid40.jsonl", "exp1.rank1.pid41.jsonl"]
    assert load_recordings([prefix.parent]).names == ["exp1.rank0.pid40.jsonl", "exp1.rank1.pid41.jsonl"]


def test_a_mistyped_option_is_told_with_its_commands_usage() -> None:
    result = run_cli("watch", "--frobnicate")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: tuimon watch ")
    assert result.stderr.strip().endswith("tuimon watch: error: unrecognized arguments: --frobnicate")


def test_a_missing_repro_bundle_is_said_to_be_missing(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("repro", "show", str(tmp_path / "nope.zip")),
                          f"cannot read {tmp_path / 'nope.zip'}: No such file or directory")


def test_tail_that_hears_nothing_says_so_and_exits_1(tmp_path: Path) -> None:
    result = run_cli("tail", "127.0.0.1:1", "--for", "1", env={"TUIMON_RUNTIME_DIR": str(tmp_path)})
    assert result.returncode == 1 and result.stdout == ""
    assert "nothing heard from 127.0.0.1:1" in result.stderr


def test_unknown_theme_says_so_before_the_screen_opens(tmp_path: Path) -> None:
    result = run_cli("watch", "--theme", "neon", env={"TUIMON_RUNTIME_DIR": str(tmp_path)})
    assert_one_line_error(result, "unknown theme 'neon'", "tuimon-contrast")


def test_bad_replay_speed_says_so(recording: Path) -> None:
    assert_one_line_error(run_cli("replay", str(recording), "--speed", "3"), "bad speed '3'")


def test_demo_without_torch_says_how_to_install_it() -> None:
    # torch made unimportable in this process only, as on a viewer-only install
    code = "import sys; sys.modules['torch'] = None; from tuimon.cli import main; sys.exit(main(['demo']))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert_one_line_error(result, "PyTorch", f"{sys.executable} -m pip install 'numpy>=1.26' 'torch>=2.1'")


@pytest.mark.parametrize(
    ("module", "framework", "requirement"),
    [
        ("publisher.integrations.transformers", "transformers", "'transformers>="),
        ("publisher.integrations.lightning", "lightning", "'lightning>="),
        ("publisher.integrations.pytorch_lightning", "pytorch_lightning", "'pytorch-lightning>="),
    ],
)
def test_a_callback_without_its_framework_says_how_to_install_it(
    module: str, framework: str, requirement: str
) -> None:
    code = f"import sys; sys.modules[{framework!r}] = None; import {module}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: {module} needs {framework}, which is not installed here: ")
    assert f"{sys.executable} -m pip install " in last and requirement in last


# --------------------------------------------------------------------------- the terminal goes away


def assert_exits_quickly(process: subprocess.Popen[bytes]) -> None:
    started = time.monotonic()
    try:
        process.wait(HANGUP_EXIT_S)
    except subprocess.TimeoutExpired:
        cpu = psutil.Process(process.pid).cpu_percent(interval=0.5)
        pytest.fail(f"still running {HANGUP_EXIT_S} s after the terminal went away, using {cpu:.0f}% CPU")
    assert time.monotonic() - started < HANGUP_EXIT_S


@pytest.fixture(params=["replay", "watch"])
def dashboard_args(request: pytest.FixtureRequest, recording: Path, tmp_path: Path) -> tuple[list[str], dict]:
    if request.param == "replay":
        return ["replay", str(recording), "--speed", "0.5"], {}
    return ["watch"], {"TUIMON_RUNTIME_DIR": str(tmp_path / "runtime")}


def test_sighup_ends_the_dashboard(dashboard_args: tuple[list[str], dict]) -> None:
    args, env = dashboard_args
    terminal = Terminal(args, env, controlling=True)
    try:
        terminal.read_until(b"Quit")
        terminal.process.send_signal(signal.SIGHUP)
        assert_exits_quickly(terminal.process)
        assert terminal.process.returncode == 0  # a clean exit, not death by signal
    finally:
        terminal.kill()


def test_closing_the_terminal_ends_the_dashboard(dashboard_args: tuple[list[str], dict]) -> None:
    args, env = dashboard_args
    terminal = Terminal(args, env, controlling=True)
    try:
        terminal.read_until(b"Quit")
        terminal.close()  # the SSH connection drops: the kernel hangs up the terminal
        assert_exits_quickly(terminal.process)
    finally:
        terminal.kill()


def test_a_dead_terminal_without_sighup_ends_the_dashboard(dashboard_args: tuple[list[str], dict]) -> None:
    """No controlling terminal (or SIGHUP ignored): Textual alone would spin a core here."""
    args, env = dashboard_args
    terminal = Terminal(args, env, controlling=False)
    try:
        terminal.read_until(b"Quit")
        terminal.close()
        assert_exits_quickly(terminal.process)
    finally:
        terminal.kill()


def test_sighup_ends_the_dashboard_even_when_its_terminal_stopped_reading(recording: Path) -> None:
    """A frozen SSH link: output backs up until Textual's UI thread blocks on its output queue;
    only a watch outside the UI thread can still end the process."""
    terminal = Terminal(["replay", str(recording), "--speed", "64"], {}, controlling=True)
    try:
        terminal.read_until(b"Quit")
        time.sleep(4.0)  # nobody reads: the pty buffer and Textual's output queue fill up
        terminal.process.send_signal(signal.SIGHUP)
        started = time.monotonic()
        while terminal.process.poll() is None and time.monotonic() - started < HANGUP_GRACE_S + 3:
            time.sleep(0.1)  # still not reading
        assert terminal.process.poll() is not None, "the dashboard hung on its stopped terminal"
    finally:
        terminal.kill()
