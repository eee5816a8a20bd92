"""Options that several subcommands share, defined once so their names and help agree."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from publisher.wire.curve import JobKeys

KB_HELP = "incident knowledge base folder (default: $TUIMON_KB, config, ~/.local/share/tuimon/kb)"


def add_kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", metavar="DIR", help=KB_HELP)


def add_dashboard_options(parser: argparse.ArgumentParser) -> None:
    """``--theme`` and ``--kb``: every command that opens the dashboard takes them."""
    parser.add_argument(
        "--theme", metavar="T", help="tuimon-dark (default), tuimon-light, tuimon-contrast, ..."
    )
    add_kb_option(parser)


KEYS_HELP = (
    "the job's CURVE keys, for addresses beyond loopback (`tuimon keys`; default: $TUIMON_KEYS, else "
    "~/.config/tuimon/keys/job.key_secret when it exists); naming them uses them for every address"
)


def add_keys_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", metavar="FILE", help=KEYS_HELP)


def keys_from(args: argparse.Namespace) -> tuple[JobKeys | None, bool]:
    """The job's keys for a receiver, from ``--keys`` (else where they are kept by default), and
    whether they were named; a one-line error for a bad file."""
    from publisher.wire.curve import load_keys
    from tuimon.errors import UserError

    try:
        return load_keys(args.keys), args.keys is not None
    except ValueError as exc:
        raise UserError(str(exc)) from None
