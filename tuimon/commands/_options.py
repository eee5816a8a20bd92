"""Options that several subcommands share, defined once so their names and help agree."""

from __future__ import annotations

import argparse

KB_HELP = "incident knowledge base folder (default: $TUIMON_KB, config, ~/.local/share/tuimon/kb)"


def add_kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", metavar="DIR", help=KB_HELP)


def add_dashboard_options(parser: argparse.ArgumentParser) -> None:
    """``--theme`` and ``--kb``: every command that opens the dashboard takes them."""
    parser.add_argument(
        "--theme", metavar="T", help="tuimon-dark (default), tuimon-light, tuimon-contrast, ..."
    )
    add_kb_option(parser)
