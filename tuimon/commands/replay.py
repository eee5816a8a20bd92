"""``tuimon replay``: the dashboard over recordings, with pause, speed and seek."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tuimon.commands._options import add_baseline_option, add_dashboard_options, baseline_from

if TYPE_CHECKING:
    from tuimon.sink import Sink
    from tuimon.store import Store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay recorded runs in the dashboard",
        description="Replay JSON Lines recordings (written by --record or `tuimon demo`) in the dashboard. "
        "Several files (e.g. one per rank) are merged by time. Keys: space pause, +/- speed, "
        "left/right seek 10 s, home/end.",
    )
    parser.add_argument("files", nargs="+", metavar="RECORDING",
                        help="a recording: a .jsonl file, the PREFIX of `tuimon run --record PREFIX` (every "
                        "rank's file), or a folder of them")
    parser.add_argument(
        "--speed",
        default="1",
        metavar="X",
        help="playback speed: 0.5, 1 (recorded pace, default), 2, 4, 8, 16, 32, 64 or max",
    )
    parser.add_argument("--paused", action="store_true", help="open paused at the start")
    parser.add_argument("--run", metavar="NAME", help="show this run first")
    add_baseline_option(parser)
    add_dashboard_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    baseline = baseline_from(args)  # a bad one is said before the dashboard's imports

    from tuimon.sources.replay import ReplaySource, parse_speed
    from tuimon.ui.terminal import run_dashboard

    tap = None
    if baseline is not None:
        from tuimon.compare.band import BaselineWatch

        def tap(store: Store) -> Sink:
            return BaselineWatch(store, baseline, store)

    source = ReplaySource(args.files, speed=parse_speed(args.speed), paused=args.paused, tap=tap)
    return run_dashboard(source, args.theme, run=args.run, kb_dir=args.kb, baseline=baseline)
