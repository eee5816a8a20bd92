"""``tuimon repro show FILE``: what a repro bundle holds, without torch.

A bundle is written on the first non-finite step of an episode (:mod:`publisher.nonfinite`);
this prints its manifest (:mod:`publisher.wire.repro_bundle`): the step, loss and lr, where the
first non-finite value came from and whether a re-run reproduced it, what to do next, the
model's inputs, the seed and versions, and how to open it in a notebook.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from publisher.wire.repro_bundle import read_manifest
from tuimon.commands._options import WrappedHelp
from tuimon.errors import UserError

_EXAMPLES = """\
examples:
  tuimon repro show runs/exp1.rank0.pid4242.step60.repro.zip
  tuimon repro show FILE --json | jq .origin

in Python: from publisher import repro; case = repro.load(FILE); args, kwargs = case.inputs()"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "repro",
        help="what a repro bundle of a non-finite step holds",
        description="Inspect the repro bundle written when a step's gradients turned non-finite.",
        epilog=_EXAMPLES,
        formatter_class=WrappedHelp,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="summarise a bundle")
    show.add_argument("file", metavar="FILE", help="a .repro.zip file")
    show.add_argument("--json", action="store_true", help="the whole manifest as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        manifest = read_manifest(args.file)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(manifest, indent=1) if args.json else summary(manifest), flush=True)
    return 0


def _verdict(origin: dict[str, Any]) -> str:
    if not origin.get("rerun"):
        return f"not re-run: {origin.get('why')}"
    if origin.get("module") == "loss":
        return ("outside the model: the loss function, or a one-off fault in the backward "
                "(the loss is not re-run)")
    if not origin.get("reproduced"):
        return ("not reproduced: the re-run on the same inputs and RNG state is finite. Not the code: "
                "suspect the hardware (silent data corruption, a flaky device) or a race; "
                "check the node's health")
    if origin.get("module") == "input":
        return "reproduced: the model's inputs (the batch) hold NaN or Inf"
    return (f"reproduced: the {origin.get('phase')} of {origin.get('module')} ({origin.get('class')}) "
            "produces it from finite inputs")


def summary(manifest: dict[str, Any]) -> str:
    """The bundle in a few lines."""
    origin = manifest.get("origin") or {}
    holds = manifest.get("holds") or {}
    versions = manifest.get("versions") or {}
    lines = [
        f"run {manifest.get('run')}, rank {manifest.get('rank')}, step {manifest.get('step')}: "
        f"loss {manifest.get('loss')}, grad_norm {manifest.get('grad_norm')}, lr {manifest.get('lr')}",
        f"origin: {_verdict(origin)}",
    ]
    if origin.get("why") and origin.get("rerun"):
        lines.append(f"  why: {origin['why']}")
    if origin.get("rerun"):
        lines.append(f"  re-run of {origin.get('calls')} model call(s) took {origin.get('rerun_s')} s")
    lines.append(f"policy: {manifest.get('policy')}; seed: {manifest.get('seed')}")
    for index, call in enumerate(manifest.get("inputs") or []):
        lines.append(f"input {index}: {call.get('module')}(args={call.get('args')}, "
                     f"kwargs={call.get('kwargs')})")
    lines.append(f"batch: {manifest.get('batch')}")
    lines.append("holds: " + ", ".join(f"{k} {v}" for k, v in holds.items()))
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    lines.append("open it: from publisher import repro; case = repro.load(FILE); "
                 "args, kwargs = case.inputs(); case.restore_rng()")
    return "\n".join(lines)
