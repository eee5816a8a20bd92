"""``tuimon keys``: make the job's CURVE key pair (once per job; copy the file to every node)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="make the CURVE keys that sockets beyond loopback require",
        description=(
            "Make the job's CURVE key pair: FILE (the secret, mode 0600) and FILE without _secret "
            "(the public half). Publishers and relays that listen beyond loopback require it; viewers "
            "and relays that connect to them use it. Copy FILE to every node of the job (same path, "
            "or point $TUIMON_KEYS at it); whoever can read it can join the job."
        ),
        epilog="example: tuimon keys && scp ~/.config/tuimon/keys/job.key_secret node2:.config/tuimon/keys/",
    )
    parser.add_argument(
        "file",
        nargs="?",
        type=Path,
        help="where to write the secret key "
        "(default: $TUIMON_KEYS, else ~/.config/tuimon/keys/job.key_secret)",
    )
    parser.add_argument(
        "--replace", action="store_true", help="overwrite existing keys (every node needs the new ones)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import os

    from publisher.wire.curve import ENV_KEYS, default_keys_file, make_keys
    from tuimon.errors import UserError

    target = args.file or (Path(os.environ[ENV_KEYS]).expanduser() if os.environ.get(ENV_KEYS) else None)
    try:
        made = make_keys(target or default_keys_file(), replace=args.replace)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    print(made)
    print(
        f"tuimon keys: wrote {made} (secret, 0600) and {made.with_suffix('.key')} (public); copy the "
        "secret file to every node of the job",
        file=sys.stderr,
    )
    return 0
