"""``tuimon demo``: a real CPU training with scripted incidents, watched live, recorded to replay.

The training (``python -m publisher.demo``) runs as a child process with a private registry
folder, so the dashboard shows only it. When the dashboard closes, the child is asked to stop
(SIGTERM: it ends its run as "interrupted" and flushes its recording) and the recording's path is
printed with the command that replays it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from publisher.extras import install_command, python_command, runnable
from tuimon.commands._options import add_dashboard_options
from tuimon.errors import UserError
from tuimon.sink import Notice

if TYPE_CHECKING:
    from tuimon.sources.base import Source

#: Seconds the demo gets to end its run and flush its recording after SIGTERM.
STOP_TIMEOUT_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="watch a small real training with scripted incidents",
        description="Train a small model on the CPU with 4 SIMULATED GPUs and scripted incidents (loss "
        "spike, NaN loss, a starving GPU, thermal throttling) and watch it live. Needs PyTorch.",
    )
    parser.add_argument(
        "--steps", type=int, default=0, metavar="N", help="steps to train (default 0: until you quit)"
    )
    parser.add_argument(
        "--record", metavar="PATH", help="recording to write (default: a new file in the temp folder)"
    )
    add_dashboard_options(parser)
    parser.set_defaults(handler=run)


def _default_recording() -> Path:
    return Path(tempfile.gettempdir()) / f"tuimon-demo-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("torch") is None:
        raise UserError(
            "the demo trains a small model with PyTorch, which is not installed here: "
            f"{install_command('torch', 'torch')} (`make demo` in tuimon's repository sets up an environment "
            "with PyTorch's CPU build)"
        )
    if args.steps < 0:
        raise UserError("--steps must be 0 (until you quit) or more")
    from tuimon.sources.live import LiveSource
    from tuimon.ui.terminal import run_dashboard

    recording = Path(args.record) if args.record else _default_recording()
    runtime = Path(tempfile.mkdtemp(prefix="tuimon-demo-"))
    log_path = runtime / "demo.log"
    source = LiveSource(registry_dir=runtime, waiting_hint="starting the demo training (PyTorch on the CPU)")
    command = [sys.executable, "-m", "publisher.demo", "--steps", str(args.steps), "--record", str(recording)]
    env = {**os.environ, "TUIMON_RUNTIME_DIR": str(runtime)}
    try:
        with log_path.open("wb") as log:
            child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            watcher = threading.Thread(target=_report_exit, args=(child, source, log_path), daemon=True)
            watcher.start()
            status = run_dashboard(source, args.theme, cleanup=child.terminate, kb_dir=args.kb)
        finally:
            exited_by_itself = _stop(child)
        failed = exited_by_itself and child.returncode != 0
        if failed:
            print(f"tuimon: the demo training exited with code {child.returncode}:", file=sys.stderr)
            print(log_path.read_text(errors="replace")[-2000:], file=sys.stderr, end="")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    if recording.is_file() and recording.stat().st_size:
        print(f"recording: {recording}\nreplay it with: {tuimon_command()} replay {recording}")
    return 1 if failed else status


def tuimon_command() -> str:
    """``tuimon`` when the PATH has this installation's, else the path of its script (``make demo``
    does not activate its virtual environment), else the module run by this Python."""
    script = Path(sys.executable).with_name("tuimon")
    return runnable("tuimon", script) if script.is_file() else f"{python_command()} -m tuimon.cli"


def _report_exit(child: subprocess.Popen[bytes], source: Source, log_path: Path) -> None:
    """Tell the screen if the training dies early (the log is gone once the demo ends)."""
    code = child.wait()
    if code != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
        detail = f": {tail[0]}" if tail else ""
        source.store.tell(Notice("demo", f"the demo training exited with code {code}{detail}"))


def _stop(child: subprocess.Popen[bytes]) -> bool:
    """SIGTERM (the demo ends its run and flushes its recording), then kill if it hangs.

    Returns whether the child had already exited by itself (its exit code then tells how it went).
    """
    if child.poll() is not None:
        return True
    child.terminate()
    try:
        child.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    return False
