"""The ``tuimon`` command line: dispatches to the subcommand modules in :mod:`tuimon.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

import tuimon
import tuimon.commands
from tuimon.errors import UserError

# The order subcommands are listed in ``tuimon --help``; any other module found is appended.
_PREFERRED_ORDER = ("watch", "replay", "demo", "run", "incidents")


def _command_modules() -> list[str]:
    found = {
        info.name for info in pkgutil.iter_modules(tuimon.commands.__path__) if not info.name.startswith("_")
    }
    ordered = [name for name in _PREFERRED_ORDER if name in found]
    return ordered + sorted(found - set(ordered))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuimon",
        description="Live terminal monitor for AI model training, with an incident knowledge base.",
    )
    parser.add_argument("--version", action="version", version=f"tuimon {tuimon.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _command_modules():
        importlib.import_module(f"tuimon.commands.{name}").register(subparsers)
    for command in subparsers.choices.values():
        command.set_defaults(command_parser=command)  # a mistake is told with its command's usage
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"tuimon: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error. Point stdout at devnull so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
