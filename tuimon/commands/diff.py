"""``tuimon diff A B``: what differs between two runs, recorded or live, and where their curves part.

The comparison itself is :mod:`tuimon.compare` (the same rule draws ``--baseline``'s band on the
dashboard); this module reads the two runs and prints. Exit status: 0 when nothing differs beyond
noise, 1 when something does, 2 when a run cannot be read (a one-line error naming it).
"""

from __future__ import annotations

import argparse

from tuimon.commands._options import WrappedHelp, add_keys_option, keys_from, positive_seconds

_EXAMPLES = """\
examples:
  tuimon diff runs/exp1 runs/exp2                 (the prefixes given to `tuimon run --record`)
  tuimon diff runs/exp1.rank0.pid4242.jsonl 5555  (a recording against a live run's address)
  tuimon diff runs/exp1 exp2 --json | jq .counted (against the live run named exp2, for scripts)

exit status: 0 nothing differs beyond noise, 1 something does, 2 a run could not be read"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="what differs between two runs, and where their curves part",
        description="Compare two runs, each a recording (a file, the prefix given to `tuimon run "
        "--record`, or a folder) or a live run (an address as `tuimon watch` takes it, or a run's name "
        "in this node's registry): the command, config, seeds, versions, git commit, environment and "
        "hardware; the first step where the loss, gradient norm and learning rate part beyond "
        "their own step-to-step noise; the event kinds and invariant violations only one run has.",
        epilog=_EXAMPLES,
        formatter_class=WrappedHelp,
    )
    parser.add_argument("a", metavar="A", help="the first run: recording, prefix, address or run name")
    parser.add_argument("b", metavar="B", help="the second run")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument("--run-a", metavar="NAME", help="the run of A to compare, when it holds several")
    parser.add_argument("--run-b", metavar="NAME", help="the run of B to compare, when it holds several")
    parser.add_argument(
        "--listen", type=positive_seconds, default=None, metavar="SECONDS",
        help="how long to listen to a live run at most (default 6: its snapshot comes within ~3)",
    )
    add_keys_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tuimon.compare.report import compare, render_json, render_text
    from tuimon.compare.sources import LISTEN_S, load_run

    keys, explicit = keys_from(args)
    listen_s = args.listen if args.listen is not None else LISTEN_S
    a = load_run(args.a, run=args.run_a, listen_s=listen_s, keys=keys, explicit_keys=explicit)
    b = load_run(args.b, run=args.run_b, listen_s=listen_s, keys=keys, explicit_keys=explicit)
    comparison = compare(a, b)
    print(render_json(comparison) if args.json else render_text(comparison), flush=True)
    return 1 if comparison.differs else 0
