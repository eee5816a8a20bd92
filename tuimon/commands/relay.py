"""``tuimon relay``: gather a node's ranks (or a job's node relays) behind one address."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from tuimon.commands._options import WrappedHelp
from tuimon.commands._receiving import STOP_SIGNALS, stopped_by_signals

#: Where ``tuimon run --relay`` and ``tuimon relay`` read the root's address when none is given.
ENV_RELAY = "TUIMON_RELAY"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "relay",
        help="forward a node's runs (or a job's node relays) to one address",
        description=(
            "Forward every message of this node's runs (found in the run registry, as `tuimon watch` "
            "does, plus any --from address) to one address. Node relays forward to a root with "
            "--upstream; viewers connect to either with `tuimon watch ADDR`. Forwarding is ZeroMQ's "
            "own proxy: viewers and the root receive only what they subscribe to. A root listens on "
            "ADDR for viewers and on the next port (ipc: ADDR.in) for node relays."
        ),
        epilog=(
            "example: tuimon relay --root --listen tcp://0.0.0.0:7000   (on the login node)\n"
            "         tuimon relay --upstream tcp://login1:7000          (on each training node)\n"
            "         tuimon watch tcp://login1:7000"
        ),
        formatter_class=WrappedHelp,
    )
    parser.add_argument(
        "--root", action="store_true", help="gather node relays (binds ADDR and the next port)"
    )
    parser.add_argument(
        "--listen",
        metavar="ADDR",
        help="where viewers connect (node relay default: tcp://127.0.0.1:<free port>; a root needs one)",
    )
    parser.add_argument(
        "--upstream",
        metavar="ADDR",
        help=f"the root relay's address, as given to its --listen (default for a node relay: ${ENV_RELAY})",
    )
    parser.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        metavar="ADDR",
        help="also forward this publisher or relay (repeatable)",
    )
    parser.add_argument(
        "--keys",
        metavar="FILE",
        help="the job's CURVE keys (`tuimon keys`; default: $TUIMON_KEYS, else "
        "~/.config/tuimon/keys/job.key_secret): "
        "required to listen beyond loopback, used to reach a root beyond loopback",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="listen beyond loopback without CURVE: anyone who can reach the port reads every run",
    )
    parser.add_argument(
        "--no-registry",
        action="store_true",
        help="do not look for this node's runs in the run registry (the default for a root)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from publisher.wire.curve import beyond_loopback, insecure_allowed, load_keys
    from publisher.wire.registry import runtime_dir
    from tuimon.errors import UserError
    from tuimon.relay.forwarder import Relay
    from tuimon.sources.live import parse_endpoint

    if args.root and args.listen is None:
        raise UserError("a root relay needs --listen ADDR: the one address node relays and viewers are given")
    if args.root and args.upstream:
        raise UserError("a root relay has no --upstream: it is the top of the tree")
    listen = args.listen or "tcp://127.0.0.1:*"
    upstream_text = None if args.root else args.upstream or os.environ.get(ENV_RELAY) or None
    upstream = parse_endpoint(upstream_text) if upstream_text else None
    scan = not (args.root or args.no_registry)
    try:
        registry = runtime_dir() if scan else None
    except PermissionError as exc:
        raise UserError(str(exc)) from None
    try:
        keys = load_keys(args.keys)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    insecure = args.insecure or insecure_allowed()
    relay = Relay(
        listen=listen,
        sources=[parse_endpoint(source) for source in args.sources],
        upstream=upstream,
        root=args.root,
        registry_dir=registry,
        keys=keys,
        explicit_keys=args.keys is not None,
        insecure=insecure,
    )
    if insecure and beyond_loopback(relay.listen):
        print(
            f"tuimon relay: warning: {relay.listen} is reachable from other machines without CURVE "
            "(--insecure): "
            "anyone who can reach it reads every run forwarded here (metrics, events, config, argv)",
            file=sys.stderr,
        )
    where = f"; node relays send to {relay.intake}" if relay.intake else ""
    to = f", forwarding to the root at {upstream}" if upstream else ""
    print(
        f"tuimon relay ({relay.name}): viewers connect to {relay.listen}{where}{to}",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    with stopped_by_signals(stop, (*STOP_SIGNALS, signal.SIGHUP)):
        relay.serve(stop)
    return 0
