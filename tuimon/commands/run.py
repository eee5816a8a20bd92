"""``tuimon run -- COMMAND``: monitor an unmodified training program (zero code change)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from publisher.wire.repro_bundle import POLICIES
from publisher.wire.run_summary import SUMMARY_DIR_ENV
from tuimon.commands import _run_report as run_report
from tuimon.errors import UserError

#: The exit status of a run that succeeded but raised an event ``--fail-on`` names.
FAILED_ON_EVENTS = 3
#: ``--fail-on`` severity -> the severities that fail the run.
_AT_LEAST = {"critical": ("critical",), "warning": ("critical", "warning")}
#: Signals passed on to the training program rather than killing the launcher first.
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training program with the publisher attached, no code change",
        description=(
            "Run COMMAND with tuimon's publisher hooked into PyTorch in every Python process it "
            "starts (torchrun workers and torch.multiprocessing.spawn children included; each "
            "reports its own rank). Watch it with `tuimon watch`. When COMMAND ends, says how the run "
            "ended: its steps, its events by severity (the first critical one with its step), where "
            "its recording and repro bundles are. The exit status is COMMAND's (see --fail-on)."
        ),
        epilog="example: tuimon run --record runs/exp1 -- python train.py --lr 3e-4",
    )
    parser.add_argument(
        "--run", metavar="NAME", help="run name shared by all ranks (default: script name + time)"
    )
    parser.add_argument(
        "--record",
        metavar="PATH",
        help="record every message: each process writes PATH.rank<R>.pid<P>.jsonl",
    )
    parser.add_argument(
        "--endpoint",
        metavar="ADDR",
        help="PUB address (default tcp://127.0.0.1:<random>); a fixed port is shifted by the local rank",
    )
    parser.add_argument(
        "--gpu",
        choices=("auto", "nvml", "simulated", "none"),
        default="auto",
        help="GPU telemetry source (default: NVML when a driver exists)",
    )
    parser.add_argument(
        "--relay",
        metavar="ADDR",
        help="the job's root relay (`tuimon relay --root --listen ADDR`): this node's first process "
        "starts the node relay that forwards to it (default: $TUIMON_RELAY)",
    )
    parser.add_argument(
        "--keys",
        metavar="FILE",
        help="the job's CURVE keys (`tuimon keys`), for an --endpoint or a --relay beyond loopback "
        "(passed on as $TUIMON_KEYS)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow an --endpoint beyond loopback without CURVE (anyone who can reach it reads the run)",
    )
    parser.add_argument(
        "--repeated-batches",
        action="store_true",
        help="the program repeats batches on purpose (an overfit-one-batch check): not reported",
    )
    parser.add_argument(
        "--on-nonfinite",
        choices=POLICIES,
        default="report",
        help="a step whose gradients are NaN or Inf, checked before the update: report it (default), "
        "skip its update, or stop training; the first of an episode is re-run to name the module that "
        "produced it, and a repro bundle is written next to the recording",
    )
    parser.add_argument(
        "--grad-norm-budget", type=_share, metavar="SHARE",
        help="the share of step time the gradient norm may cost (the Monitor's default: 0.005): on "
        "the steps it skips, a NaN is found only by the loss; 1 checks every step, so that the first "
        "poisoned one is always caught before its update",
    )
    parser.add_argument(
        "--repro-weights", action="store_true",
        help="repro bundles hold the model's weights too (they can be large)",
    )
    parser.add_argument(
        "--fail-on", choices=("critical", "warning"), metavar="SEVERITY",
        help="exit with status 3 when COMMAND succeeded but the run raised an event this serious "
        "or worse (critical or warning), for CI and schedulers; by default the exit status is COMMAND's",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    parser.set_defaults(handler=run)


def _share(text: str) -> float:
    """A share of step time, 0 < SHARE <= 1, for argparse."""
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a share of the step: give 0 < SHARE <= 1")
    return share


def _default_run_name(command: list[str]) -> str:
    """``train-20261129-193000`` for ``python train.py``: the script's name, else the program's."""
    script = next((arg for arg in command[1:] if arg.endswith(".py")), command[0])
    return f"{Path(script).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def child_environment(
    *, run: str, record: str | None, endpoint: str | None, gpu: str, repeated_batches: bool = False,
    on_nonfinite: str = "report", repro_weights: bool = False, grad_norm_budget: float | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment that makes every Python process of the job load the publisher's hooks."""
    from publisher.autohook import AUTOSTART_DIR
    from publisher.extras import checkout

    env = dict(os.environ if base is None else base)
    autostart = str(AUTOSTART_DIR)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (autostart, env.get("PYTHONPATH"))))
    env["TUIMON_AUTOSTART"] = "1"
    # named by a process that cannot import the publisher (another Python): how to fix that
    env["TUIMON_PYTHON"] = sys.executable
    source = checkout()
    if source is not None:
        env["TUIMON_SOURCE"] = str(source)
    env["TUIMON_RUN"] = run
    env["TUIMON_GPU"] = gpu
    env["TUIMON_REPEATED_BATCHES"] = "1" if repeated_batches else "0"
    env["TUIMON_ON_NONFINITE"] = on_nonfinite
    env["TUIMON_REPRO_WEIGHTS"] = "1" if repro_weights else "0"
    budget = None if grad_norm_budget is None else repr(grad_norm_budget)
    for name, value in (("TUIMON_RECORD", record), ("TUIMON_ENDPOINT", endpoint),
                        ("TUIMON_GRAD_NORM_BUDGET", budget)):
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return env


#: Seconds the node relay keeps forwarding after the command ends, so its run_end reaches the root.
_RELAY_LINGER_S = 1.0


def _start_node_relay(root: str | None, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """The node relay for ``tuimon run --relay ROOT``, started by the node's first process only
    (``LOCAL_RANK`` unset, as when ``tuimon run`` wraps ``torchrun``, or 0, as when each worker
    runs under ``tuimon run``); None when there is no root or another process of the node has it."""
    if not root or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    from tuimon.sources.live import parse_endpoint

    relay_env = {name: value for name, value in env.items() if name not in ("PYTHONPATH", "TUIMON_AUTOSTART")}
    relay_env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "tuimon.cli", "relay", "--upstream", parse_endpoint(root)],
                            env=relay_env)


def _stop_node_relay(relay: subprocess.Popen[bytes]) -> None:
    time.sleep(_RELAY_LINGER_S)
    relay.terminate()
    try:
        relay.wait(timeout=5)
    except subprocess.TimeoutExpired:
        relay.kill()


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("no command given: use `tuimon run [OPTIONS] -- python train.py ...`")
    started = time.monotonic()
    if shutil.which(command[0]) is None:
        raise UserError(f"command not found: {command[0]!r} (check the name or give its full path)")
    record = None
    if args.record:
        record = str(Path(args.record).expanduser().resolve())
        Path(record).parent.mkdir(parents=True, exist_ok=True)
    env = child_environment(
        run=args.run or _default_run_name(command), record=record, endpoint=args.endpoint, gpu=args.gpu,
        repeated_batches=args.repeated_batches, on_nonfinite=args.on_nonfinite,
        repro_weights=args.repro_weights, grad_norm_budget=args.grad_norm_budget,
    )
    if args.keys:
        env["TUIMON_KEYS"] = str(Path(args.keys).expanduser().resolve())
    if args.insecure:
        env["TUIMON_INSECURE"] = "1"
    accounts_dir = Path(tempfile.mkdtemp(prefix="tuimon-run-"))
    env[SUMMARY_DIR_ENV] = str(accounts_dir)
    try:
        status = _run_command(command, env, args.relay or os.environ.get("TUIMON_RELAY"))
        accounts = run_report.collect(accounts_dir)
    finally:
        shutil.rmtree(accounts_dir, ignore_errors=True)
    wall_s = time.monotonic() - started
    # A child killed by a signal: report it the way a shell does.
    status = 128 - status if status < 0 else status
    for line in run_report.report_lines(accounts, wall_s=wall_s, exit_status=status, record=args.record):
        print(f"tuimon: {line}", file=sys.stderr)
    if status == 0 and args.fail_on and run_report.worst_severity(accounts) in _AT_LEAST[args.fail_on]:
        print(f"tuimon: exit status {FAILED_ON_EVENTS}: the run raised a {args.fail_on} event or worse "
              "(--fail-on)", file=sys.stderr)
        return FAILED_ON_EVENTS
    return status


def _run_command(command: list[str], env: dict[str, str], relay_root: str | None) -> int:
    """Run ``command`` (with the node relay, when asked), passing signals on; its status."""
    relay = _start_node_relay(relay_root, env)
    child = subprocess.Popen(command, env=env)
    previous = {
        sig: signal.signal(sig, lambda signum, frame: child.send_signal(signum)) for sig in _FORWARDED
    }
    try:
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if relay is not None:
            _stop_node_relay(relay)
    return status
