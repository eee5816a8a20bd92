"""Everything only a GPU machine can check, in one command and under 8 minutes: ``make gpu-check``.

    python benchmarks/gpu_check.py [--budget 480]

The suite runs on CPUs (``make test``); what it cannot reach there is checked here, each stage in
its own process with its own timeout (a hang, or a CUDA error that poisons the process, costs one
stage, not the run), then one summary table: stage, pass/fail/skipped, seconds, key figure.

1. ``gpu tests``: the tests that skip themselves without a GPU (:data:`GPU_TESTS`: found by their
   ``skipif`` on ``torch.cuda.is_available()`` or on an NVIDIA driver). On a GPU machine a test
   of these that still skips has not run: that is a failure here, with its skip reason.
2. ``nvml reader``: the Monitor's own NVML reader (:class:`publisher.threads.gpu.NvmlSource`) over
   every device of the node; every field it reads is printed (utilisation, memory, temperature,
   power and its enforced limit, SM clock, clock-event "throttle" reasons, volatile uncorrected
   ECC errors; NVML API reference: https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html)
   and a field that came back None (not supported by the device, or an NVML error, logged) is flagged.
3. ``no-sync step``: a small CUDA classifier trained with a Monitor under
   ``torch.cuda.set_sync_debug_mode("error")``, which makes every synchronising CUDA call raise
   (https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html): the Monitor's
   per-step path (``track_data``, the ``cross_entropy`` and ``clip_grad_norm_`` watches, the
   invariants' optimizer hooks, ``Monitor.step``, its step worker) must never wait for the device.
   The Monitor's budgets are forced open (gradient norm every step, layer samples and invariant
   checks every second step, memory every step, GPUs read through NVML) and the run is longer than
   the label count of the loss watch (:data:`~publisher.patches.torch_calls.COUNTED_CALLS`), so every
   sampled measurement runs inside the checked region, from the Monitor's first step on. Three
   things the "error" mode alone would miss are checked too: the Monitor turns its own failures into
   counted telemetry errors (a raised sync would be swallowed there), the invariant checker
   switches a failing check off, and the loss watch ignores its own errors; so a second run, with a
   fresh Monitor, uses the "warn" mode and records every sync warning with its thread and the
   ``publisher`` lines on its stack; and host waits on CUDA events (``Event.synchronize``, which the
   debug mode does not cover) are counted. A control run of the same loop without a Monitor comes
   first: if the loop itself synchronises, the stage fails as inconclusive rather than blame the
   Monitor.
4. ``nonfinite (cuda)``: where a NaN came from, on the device (:mod:`publisher.nonfinite`): three
   small CUDA models whose step turns non-finite once (a forward 0/0 on a rare batch, a backward
   that overflows while the forward is finite, a one-off corrupted activation) under
   ``on_nonfinite="skip"`` and ``"stop"``: the ``nonfinite_origin`` event must name the module,
   the phase and ``reproduced`` as on the CPU; ``skip`` must keep the weights finite, ``stop``
   raise after the bundle is written; the bundle must open with ``publisher.repro.load`` (its
   tensors on the CPU) and reproduce the NaN on the device. The default ``"report"`` then runs
   under ``torch.cuda.set_sync_debug_mode("error")`` with the same 0/0: it must not synchronise,
   and the NaN must still be reported (without an origin: on a GPU it re-runs nothing).
5. ``overhead (cuda)``: ``benchmarks/overhead.py --device cuda --quick`` (its CUDA sizes: a
   launch-bound step and a ~10-50 ms one); key figure its worst ratios against their targets.

Without a CUDA device (or with a CPU-only build of torch) and without an NVIDIA driver, it says so,
lists the stages it skipped and exits with status 3: nothing here passes by default. Exit status:
0 every stage passed, 1 a stage failed, 3 a stage was skipped for want of a GPU (none failed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from publisher import repro
from publisher.invariants import InvariantConfig
from publisher.monitor import Monitor
from publisher.patches.torch_calls import COUNTED_CALLS
from publisher.stats.sampler import StatsConfig
from publisher.threads.gpu import DEVICE_FIELDS, GpuUnavailable, NvmlSource
from publisher.wire.recorder import read_recording

ROOT = Path(__file__).resolve().parent.parent

#: The tests that skip themselves without a GPU (``grep -n "skipif" tests/`` on ``cuda`` and
#: ``needs_driver``). Listed by node id: a renamed one fails stage 1 ("not found") instead of
#: silently dropping out of it.
GPU_TESTS = (
    "tests/test_layer_stats.py::test_the_hot_path_never_synchronises_with_the_gpu",
    "tests/test_layer_stats.py::test_device_batches_share_copies_and_reach_their_callbacks_in_order",
    "tests/test_gpu.py::test_nvml_reads_every_device_of_this_node_with_the_protocol_fields",
    "tests/test_monitor.py::test_compute_time_on_a_cuda_device_is_the_devices_own_work",
)
#: Exit statuses.
PASSED, FAILED, NO_GPU = 0, 1, 3
#: The whole run's wall-clock budget (s) and each stage's own limit within it.
BUDGET_S = 480
STAGE_LIMITS_S = {"gpu tests": 120, "nvml reader": 30, "no-sync step": 90, "nonfinite (cuda)": 90,
                  "overhead (cuda)": 230}
#: A stage process ends its output with this tag and a JSON object (status, figure).
RESULT_TAG = "GPU-CHECK-RESULT "
#: A row of overhead.py's table: the plain arm's step time, then the monitored arm's.
PLAIN_STEP = re.compile(r"(\d+\.\d+)ms\s*\d+\.\d+ms")
#: The step time overhead.py's large CUDA size is meant to have (ms).
LARGE_STEP_MS = (10, 50)
#: Steps of each checked run of stage 3: past the loss watch's label count, whose read-back then
#: runs inside the region, and past the Monitor's dense first steps.
SYNC_STEPS = COUNTED_CALLS + 16
#: Stage 3's loop without a Monitor: steps before the checked ones (cuBLAS and the allocator set
#: themselves up on first use, which may synchronise), then checked ones.
CONTROL_WARMUP, CONTROL_STEPS = 3, 10


@dataclass
class Outcome:
    status: str  # "pass", "fail" or "skipped"
    figure: str
    seconds: float = 0.0


# ------------------------------------------------------------------------------ what is here


def cuda_problem() -> str | None:
    """Why CUDA cannot be used here, or None."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (install a CUDA build of torch)"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no CUDA device{where}"
    return None


def nvml_problem() -> str | None:
    """Why the Monitor's NVML reader cannot open here (its own message), or None."""
    try:
        NvmlSource().close()
    except GpuUnavailable as exc:  # its message also advises the dashboard's user: not needed here
        return str(exc).removeprefix("tuimon: ").split("; GPU panel")[0]
    return None


# --------------------------------------------------------------------- stage 1: the GPU tests


def stage_gpu_tests(limit: float) -> Outcome:
    """pytest on :data:`GPU_TESTS`; every one must pass (a skip on a GPU machine is a failure)."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                   f"--junitxml={report}", *GPU_TESTS]
        code, _, timed_out = run_streamed(command, limit, "gpu tests")
        if timed_out:
            return Outcome("fail", f"timed out after {limit:.0f} s")
        if not report.exists():
            return Outcome("fail", f"pytest exited {code} without a report (a test id not found?)")
        results = junit_results(report)
    passed = [name for name, (kind, _) in results.items() if kind == "passed"]
    others = {name: found for name, found in results.items() if found[0] != "passed"}
    figure = f"{len(passed)}/{len(GPU_TESTS)} passed"
    if others:
        figure += "; " + "; ".join(f"{name} {kind}: {why}" for name, (kind, why) in others.items())
    return Outcome("pass" if len(passed) == len(GPU_TESTS) and code == 0 else "fail", figure)


def junit_results(path: Path) -> dict[str, tuple[str, str]]:
    """Each test case of a JUnit XML report: (passed/failed/error/skipped, the first line of why)."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kind, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = "failed" if child.tag == "failure" else child.tag
                why = (child.get("message") or child.text or "").strip().splitlines()[0][:160]
        results[case.get("name", "?")] = (kind, why)
    return results


# ------------------------------------------------------------------- stage 2: the NVML reader


def stage_nvml() -> Outcome:
    """Read every device once through the Monitor's reader; print every field, flag the Nones."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the reader logs NVML errors
    source = NvmlSource()
    try:
        devices = source.read()
    finally:
        source.close()
    missing = []
    for device in devices:
        print(f"GPU {device['index']}: {device['name']} ({device['uuid']})")
        for field in DEVICE_FIELDS[3:]:
            value = device[field]
            if value is None:
                missing.append(f"{field} on GPU {device['index']}")
            shown = f"{value / 2**20:,.0f} MiB" if field.startswith("mem_") and value is not None else value
            flag = "<- None: unsupported here or an NVML error" if value is None else ""
            print(f"    {field:<15}{shown!s:<24}{flag}")
    if torch.cuda.is_available() and torch.cuda.device_count() != len(devices):
        print(f"note: NVML sees {len(devices)} device(s), CUDA {torch.cuda.device_count()} (NVML reads the "
              "whole node whatever CUDA_VISIBLE_DEVICES says)")
    fields = len(DEVICE_FIELDS) - 3
    figure = f"{len(devices)} device(s) x {fields} fields"
    figure += f"; None: {', '.join(missing)}" if missing else ", none None"
    return Outcome("pass" if devices else "fail", figure)


# --------------------------------------------------------------- stage 3: no synchronisation


class Classifier:
    """A small CUDA classifier and its batches, pinned on the host as a DataLoader with
    ``pin_memory=True`` gives them (the copies to the device are then asynchronous)."""

    def __init__(self, device: torch.device, batches: int) -> None:
        torch.manual_seed(0)
        self.device = device
        self.model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                   nn.Linear(256, 10)).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        pin = device.type == "cuda"
        self.batches = [(torch.randn(32, 64).pin_memory() if pin else torch.randn(32, 64),
                         torch.randint(0, 10, (32,)).pin_memory() if pin else torch.randint(0, 10, (32,)))
                        for _ in range(batches)]

    def train(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], mon: Monitor | None) -> int:
        """One pass: the names are looked up at each call, as a script's are, so the Monitor's
        ``cross_entropy`` and ``clip_grad_norm_`` watches are on the path. Returns the steps done."""
        done = 0
        for x_host, y_host in batches:
            x = x_host.to(self.device, non_blocking=True)
            y = y_host.to(self.device, non_blocking=True)
            self.optimizer.zero_grad()
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            if mon is not None:
                mon.step(loss, samples=x.shape[0])
            done += 1
        return done


@contextlib.contextmanager
def sync_debug(mode: str, cuda: bool) -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode(mode)`` inside, "default" after (nothing on the CPU)."""
    if not cuda:
        yield
        return
    torch.cuda.synchronize()  # what was queued before is not the region's
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@contextlib.contextmanager
def sync_warnings() -> Iterator[list[str]]:
    """Every sync warning of the "warn" mode, from any thread, as ``thread: publisher lines: text``
    (the warnings go on being raised where they are; a ``try`` cannot swallow them)."""
    found: list[str] = []

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        text = str(message)
        if "synchroniz" not in text:
            return
        ours = [f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_stack()
                if f"{os.sep}publisher{os.sep}" in f.filename]
        found.append(f"{threading.current_thread().name}: {' < '.join(reversed(ours)) or filename}: "
                     f"{text.splitlines()[0]}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        yield found


@contextlib.contextmanager
def event_waits(cuda: bool) -> Iterator[list[str]]:
    """Host waits on CUDA events (``torch.cuda.Event.synchronize`` on an event the device has not
    reached), by thread: the debug mode covers stream and device synchronisation and synchronising
    copies, not these."""
    found: list[str] = []
    if not cuda:
        yield found
        return
    original = torch.cuda.Event.synchronize

    def synchronize(event: torch.cuda.Event) -> None:
        if not event.query():
            ours = [f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_stack()
                    if f"{os.sep}publisher{os.sep}" in f.filename]
            found.append(f"{threading.current_thread().name} ({' < '.join(reversed(ours))})")
        original(event)

    torch.cuda.Event.synchronize = synchronize  # type: ignore[method-assign]
    try:
        yield found
    finally:
        torch.cuda.Event.synchronize = original  # type: ignore[method-assign]


def forced_monitor(net: Classifier, record: Path) -> Monitor:
    """A Monitor whose sampled measurements all run within a few steps, whatever they cost."""
    return Monitor(net.model, net.optimizer, run="gpu-check-sync", record=record,
                   gpu="auto" if net.device.type == "cuda" else "none",
                   grad_norm_budget=1.0, memory_interval_s=0.0,
                   stats=StatsConfig(every=2, budget=1.0),
                   invariants=InvariantConfig(check_every=2, budget=1.0))


def checked_run(device: torch.device, mode: str, scratch: Path) -> tuple[list[str], dict[str, Any]]:
    """A fresh model and Monitor trained :data:`SYNC_STEPS` steps under sync debug ``mode``;
    returns the problems found and what was measured."""
    cuda = device.type == "cuda"
    net = Classifier(device, SYNC_STEPS)
    record = scratch / f"{mode}.jsonl"
    mon = forced_monitor(net, record)
    problems: list[str] = []
    with sync_warnings() as synced, event_waits(cuda) as waited:
        try:
            with sync_debug(mode, cuda):
                done = net.train(mon.track_data(net.batches), mon)
        except RuntimeError as exc:  # what "error" raises on the training thread
            done = -1
            problems.append(f"{mode}: the training thread synchronised: {str(exc).splitlines()[0]}\n"
                            + "".join(traceback.format_exception(exc)[-8:]))
    # What the Monitor measured, read outside the region: these reads are not on the step path.
    checker = mon._invariants.checker if mon._invariants is not None else None
    invariant_seconds = checker.overhead()["seconds"] if checker is not None else 0.0
    statuses = checker.statuses() if checker is not None else {}
    labels_read = mon._context.label_entropy is not None
    errors = mon.telemetry_errors
    mon.close()  # outside the region: closing drains the copies in flight (a wait, by design)
    problems += [f"{mode}: sync warning: {line}" for line in synced]
    problems += [f"{mode}: host wait on a CUDA event in thread {where}" for where in sorted(set(waited))]
    if errors:
        problems.append(f"{mode}: {errors} telemetry error(s) in the Monitor (a swallowed sync? see the log)")
    broken = {name: s["message"] for name, s in statuses.items() if "internal error" in (s["message"] or "")}
    problems += [f"{mode}: invariant {name} switched off: {why}" for name, why in broken.items()]
    metrics = [m for _, _, m in read_recording(record) if isinstance(m, dict) and m.get("type") == "metrics"]
    measured = {
        "steps": done, "published": len(metrics),
        "grad_norm": sum("grad_norm" in m["metrics"] for m in metrics),
        "layer_samples": sum("layers" in m for m in metrics),
        "cuda_memory": sum("cuda_mem_allocated" in m["metrics"] for m in metrics),
        "invariant_ms": invariant_seconds * 1e3,
        "invariants_ok": sorted(name for name, s in statuses.items() if s["status"] == "ok"),
        "labels_read": labels_read,
    }
    if done == SYNC_STEPS:  # a run cut short by a sync says so above; these would only repeat it
        if measured["published"] != SYNC_STEPS or measured["grad_norm"] != SYNC_STEPS:
            problems.append(f"{mode}: {measured['published']} steps published, {measured['grad_norm']} with"
                            f" a gradient norm, of {SYNC_STEPS}")
        if measured["layer_samples"] < SYNC_STEPS // 2 or not measured["invariant_ms"]:
            problems.append(f"{mode}: the sampled measurements did not all run ({measured['layer_samples']} "
                            f"layer samples, {measured['invariant_ms']:.1f} ms of invariant checks)")
        if cuda and measured["cuda_memory"] != SYNC_STEPS:
            problems.append(f"{mode}: CUDA memory read on {measured['cuda_memory']} of {SYNC_STEPS} steps")
    return problems, measured


def stage_sync(device: torch.device) -> Outcome:
    """The control run, then a checked run in "error" mode and one in "warn" mode."""
    cuda = device.type == "cuda"
    control = Classifier(device, CONTROL_WARMUP + CONTROL_STEPS)
    control.train(iter(control.batches[:CONTROL_WARMUP]), None)
    try:
        with sync_debug("error", cuda):
            control.train(iter(control.batches[CONTROL_WARMUP:]), None)
    except RuntimeError as exc:
        return Outcome("fail", f"inconclusive: the loop synchronises without a Monitor ({exc})")
    problems: list[str] = []
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in ("error", "warn"):
            found, runs[mode] = checked_run(device, mode, Path(scratch))
            problems += found
    for mode, measured in runs.items():
        print(f"{mode}: {json.dumps(measured)}")
    for problem in problems:
        print(f"PROBLEM {problem}")
    m = runs["error"]
    figure = (f"{len(problems)} sync(s)/problem(s) in 2 x {SYNC_STEPS} steps; grad norm {m['grad_norm']}/"
              f"{SYNC_STEPS}, {m['layer_samples']} layer samples, invariants {m['invariant_ms']:.0f} ms "
              f"({len(m['invariants_ok'])} ok), labels read back: {'yes' if m['labels_read'] else 'no'}")
    if not cuda:
        figure += " [CPU DRY RUN: proves nothing about syncs]"
    return Outcome("fail" if problems else "pass", figure)


# ----------------------------------------------------------------- stage 4: a NaN's origin


class ZeroOverZero(nn.Module):
    """Normalises each row by its absolute sum: 0/0 for a row of zeros (the rare batch), in the
    forward."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h / h.abs().sum(-1, keepdim=True)


class RowScale(nn.Module):
    """Divides each row by its length plus an epsilon: finite forward for a zero row, but the
    square root's derivative at 0 is infinite, so the backward overflows."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h / (torch.sqrt((h * h).sum(-1, keepdim=True)) + 1e-6)


class Faulty(nn.Module):
    """``embed`` (no bias: a zero sample stays zero), the faulty ``middle``, ``head``."""

    def __init__(self, middle: nn.Module) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16, bias=False)
        self.middle = middle
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.middle(self.embed(x)))


#: The step (from 1) at which each case's batch (or activation) turns bad, and the steps run.
NAN_TRIGGER, NAN_STEPS = 12, 20


def nan_batches(device: torch.device, zero_sample: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches on the device; the one of step :data:`NAN_TRIGGER` holds an all-zero sample."""
    g = torch.Generator().manual_seed(7)
    out = []
    for step in range(1, NAN_STEPS + 1):
        x = torch.randn(16, 8, generator=g)
        if zero_sample and step == NAN_TRIGGER:
            x[0] = 0.0
        out.append((x.to(device), x[:, :1].clone().to(device)))
    return out


def nan_case(device: torch.device, case: str, policy: str, scratch: Path) -> dict[str, Any]:
    """One faulty run; returns what it showed: the origin event, the losses after it, the bundle's
    checks, whether ``stop`` raised."""
    torch.manual_seed(0)
    middle = {"forward": ZeroOverZero(), "backward": RowScale(), "glitch": nn.Identity()}[case]
    model = Faulty(middle).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    armed = [False]

    def glitch(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not armed[0]:
            return None
        armed[0] = False  # once: the re-run computes cleanly
        output = output.clone()
        output[0, 0] = float("nan")
        return output

    if case == "glitch":
        model.embed.register_forward_hook(glitch)
    record = scratch / f"{case}-{policy}.jsonl"
    mon = Monitor(model, optimizer, run=f"gpu-check-{case}", record=record, gpu="none", seed=0,
                  on_nonfinite=policy)
    stopped = None
    try:
        for step, (x, y) in enumerate(mon.track_data(nan_batches(device, case != "glitch")), start=1):
            armed[0] = case == "glitch" and step == NAN_TRIGGER
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            mon.step(loss)
    except Exception as exc:  # NonFiniteStop under "stop"
        stopped = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        mon.close("failed" if stopped else "completed")
    messages = [m for _, _, m in read_recording(record) if isinstance(m, dict)]
    events = [m for m in messages if m.get("type") == "event"]
    origins = [e for e in events if e["kind"] == "nonfinite_origin"]
    found: dict[str, Any] = {"case": case, "policy": policy, "stopped": stopped,
                             "kinds": sorted({e["kind"] for e in events}), "origins": len(origins)}
    if origins:
        event = origins[0]
        origin = event["details"]["origin"]
        found.update(step=event["step"], module=origin.get("module"), phase=origin.get("phase"),
                     reproduced=origin.get("reproduced"), message=event["message"][:160])
        found.update(nan_bundle_check(model, event["details"].get("repro"), device))
    found["finite_after"] = all(math.isfinite(m["metrics"]["loss"]) for m in messages
                                if m.get("type") == "metrics" and m["step"] > NAN_TRIGGER
                                and "loss" in m["metrics"])
    return found


def nan_bundle_check(model: nn.Module, path: str | None, device: torch.device) -> dict[str, Any]:
    """The bundle opens, its inputs are CPU tensors, and they reproduce the NaN on the device (in
    the output, or in the gradients of its sum: the model is done with, so its ``.grad`` is free)."""
    if not path or not Path(path).exists():
        return {"bundle": f"missing ({path})"}
    case = repro.load(path)
    args, kwargs = case.inputs()
    on_cpu = all(a.device.type == "cpu" for a in args if isinstance(a, torch.Tensor))
    model.zero_grad()
    out = model(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
    out.sum().backward()
    return {"bundle": Path(path).name, "bundle_on_cpu": on_cpu,
            "bundle_output_finite": bool(torch.isfinite(out).all()),
            "bundle_grads_finite": all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()
                                       if p.grad is not None)}


def report_without_sync(device: torch.device, scratch: Path) -> dict[str, Any]:
    """The forward 0/0 under the default ``report`` and the "error" sync mode: nothing may wait
    for the device, and the NaN is still reported."""
    torch.manual_seed(0)
    model = Faulty(ZeroOverZero()).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    record = scratch / "report.jsonl"
    mon = Monitor(model, optimizer, run="gpu-check-report", record=record, gpu="none")
    batches = nan_batches(device, True)
    synced = None
    try:
        with sync_debug("error", device.type == "cuda"):
            for x, y in mon.track_data(batches):
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                mon.step(loss)
    except RuntimeError as exc:
        synced = str(exc).splitlines()[0]
    errors = mon.telemetry_errors
    mon.close()
    events = [m for _, _, m in read_recording(record) if isinstance(m, dict) and m.get("type") == "event"]
    nonfinite = [e for e in events if e["kind"].startswith("nonfinite")]
    return {"case": "forward", "policy": "report", "synced": synced, "telemetry_errors": errors,
            "nonfinite_events": [(e["kind"], e["step"]) for e in nonfinite]}


#: What each (case, policy) must show: module, phase, reproduced.
NAN_EXPECTED = {
    ("forward", "skip"): ("Faulty.middle", "forward", True),
    ("backward", "stop"): ("Faulty.middle", "backward", True),
    ("glitch", "skip"): (None, "forward", False),
}


def stage_nonfinite(device: torch.device) -> Outcome:
    """Each case of :data:`NAN_EXPECTED`, then ``report`` without a sync."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for (case, policy), (module, phase, reproduced) in NAN_EXPECTED.items():
            found = nan_case(device, case, policy, Path(scratch))
            print(json.dumps(found))
            name = f"{case}/{policy}"
            if found["origins"] != 1:
                problems.append(f"{name}: {found['origins']} nonfinite_origin events ({found['kinds']})")
                continue
            got = (found["module"], found["phase"], found["reproduced"])
            if got != (module, phase, reproduced) or found["step"] != NAN_TRIGGER:
                problems.append(f"{name}: origin {got} at step {found['step']}, expected "
                                f"{(module, phase, reproduced)} at {NAN_TRIGGER}")
            if policy == "skip" and not found["finite_after"]:
                problems.append(f"{name}: a non-finite loss after the skipped update")
            if policy == "stop" and not (found["stopped"] or "").startswith("NonFiniteStop"):
                problems.append(f"{name}: stop did not raise NonFiniteStop ({found['stopped']})")
            if not found.get("bundle_on_cpu"):
                problems.append(f"{name}: bundle {found.get('bundle')}: its inputs are not CPU tensors")
            shown = found.get("bundle_output_finite" if phase == "forward" else "bundle_grads_finite")
            if reproduced and shown is not False:
                problems.append(f"{name}: the bundle's inputs do not reproduce the {phase} NaN on the device")
        report = report_without_sync(device, Path(scratch))
    print(json.dumps(report))
    if report["synced"]:
        problems.append(f"report: the training thread synchronised: {report['synced']}")
    if report["telemetry_errors"]:
        problems.append(f"report: {report['telemetry_errors']} telemetry error(s) (a swallowed sync?)")
    if not report["nonfinite_events"]:
        problems.append("report: the NaN was not reported")
    for problem in problems:
        print(f"PROBLEM {problem}")
    reported = sorted({kind for kind, _ in report["nonfinite_events"]})
    figure = (f"{len(problems)} problem(s) in {len(NAN_EXPECTED)} faulty runs + report under the 'error' "
              f"sync mode (reported as {reported})")
    if device.type != "cuda":
        figure += " [CPU DRY RUN]"
    return Outcome("fail" if problems else "pass", figure)


# --------------------------------------------------------------------- stage 5: the overhead


def stage_overhead(limit: float) -> Outcome:
    """``overhead.py --device cuda --quick``; the figure is its worst ratios (and step times)."""
    command = [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--device", "cuda", "--quick"]
    code, lines, timed_out = run_streamed(command, limit, "overhead (cuda)")
    verdicts = [line.removeprefix("worst ratio ").strip() for line in lines
                if line.startswith("worst ratio ")]
    steps: dict[str, float] = {}  # each size's plain step time (ms), from its first row
    for row in lines:
        found = PLAIN_STEP.search(row)
        if found and "(cuda)" in row:
            steps.setdefault(row[:14].strip(), float(found.group(1)))
    if timed_out:
        return Outcome("fail", f"timed out after {limit:.0f} s ({len(lines)} lines of output)")
    if code != 0 or len(verdicts) != 2:
        return Outcome("fail", f"overhead.py exited {code}" + (f": {lines[-1]}" if lines else ""))
    shown = [f"{name} {ms:.2f} ms" for name, ms in steps.items()]
    figure = "; ".join(verdicts) + (f"; plain steps: {', '.join(shown)}" if shown else "")
    large = list(steps.values())[-1] if len(steps) == 2 else None
    if large is not None and not LARGE_STEP_MS[0] <= large <= LARGE_STEP_MS[1]:
        figure += f" (the large step is outside {LARGE_STEP_MS[0]}-{LARGE_STEP_MS[1]} ms on this GPU)"
    return Outcome("fail" if any("ABOVE TARGET" in v for v in verdicts) else "pass", figure)


# ------------------------------------------------------------------------------ the stages' runs


def run_streamed(command: list[str], limit: float, label: str) -> tuple[int, list[str], bool]:
    """Run ``command`` in its own process group, echoing its output as it comes; on timeout the
    group is killed (a benchmark's viewer processes too). Returns (exit status, lines, timed out)."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            print(f"  [{label}] {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        code, timed_out = process.wait(), True
    reader.join(timeout=5)
    return code, lines, timed_out


def run_stage_process(stage: str, limit: float, extra: list[str]) -> Outcome:
    """A stage of this script in a process of its own; its result is its last tagged line."""
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", stage, *extra]
    code, lines, timed_out = run_streamed(command, limit, stage)
    if timed_out:
        return Outcome("fail", f"timed out after {limit:.0f} s")
    tagged = [line for line in lines if line.startswith(RESULT_TAG)]
    if not tagged:
        return Outcome("fail", f"exited {code} without a result" + (f": {lines[-1]}" if lines else ""))
    result = json.loads(tagged[-1].removeprefix(RESULT_TAG))
    return Outcome(result["status"], result["figure"])


def stage_main(stage: str, cpu_dry_run: bool) -> int:
    """Inside a stage's process: run it, print its tagged result; the status is the parent's to judge."""
    try:
        device = torch.device("cpu" if cpu_dry_run else "cuda")
        if stage == "nvml reader":
            outcome = stage_nvml()
        elif stage == "nonfinite (cuda)":
            outcome = stage_nonfinite(device)
        else:
            outcome = stage_sync(device)
    except Exception as exc:
        traceback.print_exc()
        outcome = Outcome("fail", f"{type(exc).__name__}: {exc}")
    print(RESULT_TAG + json.dumps({"status": outcome.status, "figure": outcome.figure}), flush=True)
    return 0


def summary(outcomes: dict[str, Outcome]) -> None:
    width = max(len(o.figure) for o in outcomes.values())
    print()
    print(f"{'stage':<18}{'result':<9}{'seconds':>8}  key figure")
    print("-" * min(120, 37 + width))
    for stage, o in outcomes.items():
        seconds = f"{o.seconds:.0f}" if o.status != "skipped" else "-"
        print(f"{stage:<18}{o.status:<9}{seconds:>8}  {o.figure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help=f"seconds for the whole check (default {BUDGET_S}); stages have own limits")
    parser.add_argument("--stage", choices=("nvml reader", "no-sync step", "nonfinite (cuda)"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="develop this script without a GPU: run the no-sync and nonfinite stages' code "
                             "on the CPU "
                             f"(no sync debug mode there: it proves nothing; exit status {NO_GPU})")
    args = parser.parse_args(argv)
    if args.stage:
        return stage_main(args.stage, args.cpu_dry_run)
    started = time.monotonic()
    cuda, nvml = cuda_problem(), nvml_problem()
    print(f"torch {torch.__version__}; CUDA: {cuda or torch.cuda.get_device_name(0)}; "
          f"NVML: {nvml or 'driver found'}")
    if args.cpu_dry_run:
        dry = {}
        for stage in ("no-sync step", "nonfinite (cuda)"):
            stage_started = time.monotonic()
            dry[stage] = run_stage_process(stage, STAGE_LIMITS_S[stage], ["--cpu-dry-run"])
            dry[stage].seconds = time.monotonic() - stage_started
        summary(dry)
        if any(outcome.status != "pass" for outcome in dry.values()):
            return FAILED
        print(f"DRY RUN: the stage's code ran on the CPU; no GPU was checked (exit status {NO_GPU}).")
        return NO_GPU
    if cuda and nvml:
        print("NO GPU: no CUDA device and no NVIDIA driver (NVML) found on this machine; "
              "every stage is skipped.")
    needs: dict[str, tuple[str | None, Callable[[float], Outcome]]] = {
        "gpu tests": (cuda or nvml, stage_gpu_tests),
        "nvml reader": (nvml, lambda limit: run_stage_process("nvml reader", limit, [])),
        "no-sync step": (cuda, lambda limit: run_stage_process("no-sync step", limit, [])),
        "nonfinite (cuda)": (cuda, lambda limit: run_stage_process("nonfinite (cuda)", limit, [])),
        "overhead (cuda)": (cuda, stage_overhead),
    }
    outcomes: dict[str, Outcome] = {}
    for stage, (missing, run) in needs.items():
        left = args.budget - (time.monotonic() - started)
        if missing:
            outcomes[stage] = Outcome("skipped", f"no GPU: {missing}")
            continue
        if left < 10:
            outcomes[stage] = Outcome("fail", f"not run: the {args.budget:.0f} s budget was spent")
            continue
        print(f"\n== {stage} (limit {min(left, STAGE_LIMITS_S[stage]):.0f} s)", flush=True)
        stage_started = time.monotonic()
        outcomes[stage] = run(min(left, STAGE_LIMITS_S[stage]))
        outcomes[stage].seconds = time.monotonic() - stage_started
    summary(outcomes)
    statuses = {o.status for o in outcomes.values()}
    total = time.monotonic() - started
    if "fail" in statuses:
        print(f"FAILED ({total:.0f} s): {', '.join(s for s, o in outcomes.items() if o.status == 'fail')}")
        return FAILED
    if "skipped" in statuses:
        skipped = [s for s, o in outcomes.items() if o.status == "skipped"]
        print(f"NOT CHECKED ({total:.0f} s): no CUDA device/NVML driver here; skipped: {', '.join(skipped)}. "
              f"Exit status {NO_GPU}.")
        return NO_GPU
    print(f"PASSED ({total:.0f} s): every stage")
    return PASSED


if __name__ == "__main__":
    sys.exit(main())
