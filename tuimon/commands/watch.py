"""``tuimon watch``: the live dashboard, on given endpoints or on every run registered here."""

from __future__ import annotations

import argparse

from tuimon.commands._options import add_dashboard_options, add_keys_option, keys_from


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="live dashboard of running trainings",
        description="Open the live dashboard. Without ENDPOINT, watch every run registered on this "
        "host (the publisher registers itself), including runs started later.",
    )
    parser.add_argument(
        "endpoints",
        nargs="*",
        metavar="ENDPOINT",
        help="publisher address: tcp://HOST:PORT, HOST:PORT or PORT (on 127.0.0.1)",
    )
    parser.add_argument("--run", metavar="NAME", help="show only this run")
    add_dashboard_options(parser)
    add_keys_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tuimon.sources.live import LiveSource
    from tuimon.ui.terminal import run_dashboard

    # Bad endpoints and an unusable registry folder fail here, before the screen opens.
    keys, explicit = keys_from(args)
    source = LiveSource(args.endpoints, run=args.run, keys=keys, explicit_keys=explicit)
    return run_dashboard(source, args.theme, run=args.run, kb_dir=args.kb)
