"""``tuimon watch``: the live dashboard, on given endpoints or on every run registered here.

Live events can also alert beyond the screen (``--notify-*``, :mod:`tuimon.notify`), and the
terminal is told when the dashboard is in the background (:mod:`tuimon.ui.services.desktop_notify`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tuimon.commands._options import (
    add_baseline_option,
    add_dashboard_options,
    add_keys_option,
    add_notify_options,
    baseline_from,
    keys_from,
    notify_settings,
)

if TYPE_CHECKING:
    from tuimon.sink import Sink


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
    add_baseline_option(parser)
    add_keys_option(parser)
    add_notify_options(parser, desktop=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tuimon.notify.tap import AlertingLiveSource
    from tuimon.ui.terminal import run_dashboard

    # Bad endpoints, an unusable registry folder and bad alert settings fail here, before the
    # screen opens.
    keys, explicit = keys_from(args)
    alerts = notify_settings(args)
    baseline = baseline_from(args)
    outer = None
    if baseline is not None:
        from tuimon.compare.band import BaselineWatch

        def outer(sink: Sink) -> Sink:
            return BaselineWatch(sink, baseline, source.store)

    source = AlertingLiveSource(
        args.endpoints, alerts=alerts, run=args.run, keys=keys, explicit_keys=explicit, outer=outer
    )
    return run_dashboard(source, args.theme, run=args.run, kb_dir=args.kb, notifier=source.notifier,
                         baseline=baseline)
