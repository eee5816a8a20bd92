"""``tuimon metrics-server``: a live run's (or a whole job's) latest figures for Prometheus to scrape.

It listens as the dashboard does (the same :class:`~tuimon.sources.receiver.Receiver`: discovery,
validation, snapshot, CURVE keys) and serves :mod:`tuimon.export.prometheus` over HTTP with
prometheus_client's own server. The HTTP port binds to loopback unless ``--bind`` says otherwise:
the figures name hosts and runs.
"""

from __future__ import annotations

import argparse
import sys
import threading

from tuimon.commands._options import WrappedHelp, add_keys_option, keys_from
from tuimon.commands._receiving import receive_until, stopped_by_signals

#: The port Prometheus exporters of GPU clusters usually leave free for this (DCGM's is 9400 too,
#: so both on one node need ``--port``).
DEFAULT_PORT = 9400

_EXAMPLES = """\
examples:
  tuimon metrics-server                            (every run on this host, on 127.0.0.1:9400)
  tuimon metrics-server tcp://login1:7000 --port 9410 --bind 0.0.0.0   (a job, through its root relay)
  curl -s 127.0.0.1:9400/metrics | grep tuimon_loss"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "metrics-server",
        help="serve live runs' latest figures to Prometheus",
        description="Subscribe to a publisher or a relay (without ADDR: every run registered on "
        "this host) and serve the latest loss, learning rate, step time, data wait, throughput and "
        "GPU readings per rank and GPU, and event counts by kind and severity, on "
        "http://BIND:PORT/metrics for Prometheus. Runs until Ctrl-C or SIGTERM.",
        epilog=_EXAMPLES,
        formatter_class=WrappedHelp,
    )
    parser.add_argument(
        "address", nargs="?", metavar="ADDR",
        help="publisher or relay address: tcp://HOST:PORT, HOST:PORT or PORT (on 127.0.0.1); "
        "default: every run in the run registry",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--bind", default="127.0.0.1", metavar="HOST",
        help="interface to serve on (default 127.0.0.1; 0.0.0.0 for a Prometheus on another machine)",
    )
    add_keys_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from tuimon.errors import UserError
    from tuimon.export.prometheus import FiguresCollector, LatestFigures
    from tuimon.sources.live import listen_targets

    if not 0 < args.port < 65536:
        raise UserError(f"--port must be from 1 to 65535, got {args.port}")
    endpoints, registry_dir = listen_targets([] if args.address is None else [args.address])
    keys, explicit = keys_from(args)
    figures = LatestFigures()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(FiguresCollector(figures))
    try:
        server, _ = start_http_server(args.port, addr=args.bind, registry=registry)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {args.bind}:{args.port}: {exc.strerror or exc}") from None
    where = ", ".join(endpoints) if endpoints else f"the runs registered in {registry_dir}"
    print(f"tuimon metrics-server: http://{args.bind}:{args.port}/metrics, from {where}", file=sys.stderr,
          flush=True)
    stop = threading.Event()
    with stopped_by_signals(stop):
        try:
            receive_until(stop, figures, endpoints, registry_dir, keys, explicit)
        finally:
            server.shutdown()
    return 0
