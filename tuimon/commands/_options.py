"""Options that several subcommands share, defined once so their names and help agree."""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from publisher.wire.curve import JobKeys
    from tuimon.compare.band import Baseline
    from tuimon.notify.settings import NotifySettings

KB_HELP = "incident knowledge base folder (default: $TUIMON_KB, config, ~/.local/share/tuimon/kb)"


def add_kb_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kb", metavar="DIR", help=KB_HELP)


def add_dashboard_options(parser: argparse.ArgumentParser) -> None:
    """``--theme`` and ``--kb``: every command that opens the dashboard takes them."""
    parser.add_argument(
        "--theme", metavar="T", help="tuimon-dark (default), tuimon-light, tuimon-contrast, ..."
    )
    add_kb_option(parser)


class WrappedHelp(argparse.HelpFormatter):
    """Help whose prose is wrapped to the terminal and whose indented lines (examples) are kept as
    written: argparse's raw formatter keeps both, so a long description ran past the screen."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line if not line or line.startswith(" ")
                         else textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
                         for line in text.splitlines())


def add_baseline_option(parser: argparse.ArgumentParser) -> None:
    """``--baseline RECORDING``: a run to hold the others against (``watch``, ``replay``)."""
    parser.add_argument(
        "--baseline", metavar="RECORDING",
        help="a recording (file or --record prefix) drawn beside the run's loss and throughput; an "
        "event (baseline_departure) when the run leaves its band, as `tuimon diff` judges two runs",
    )


def baseline_from(args: argparse.Namespace) -> Baseline | None:
    """The baseline ``--baseline`` names, read before the screen opens (a one-line error if it
    cannot be), or None."""
    if args.baseline is None:
        return None
    from tuimon.compare.band import load_baseline

    return load_baseline(args.baseline)


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


def add_notify_options(parser: argparse.ArgumentParser, *, desktop: bool) -> None:
    """``--notify-cmd``, ``--notify-url``, ``--notify-level``, ``--notify-rate`` (and on the dashboard
    ``--notify-desktop``): alerts for live events, over the ``[notify]`` table of the config file."""
    from tuimon.notify.settings import DEFAULT_PER_MINUTE, DESKTOP_MODES, LEVELS

    group = parser.add_argument_group(
        "alerts",
        "Live events at or above a severity, once an episode (not those of the snapshot on\n"
        "joining), sent to a command and/or a webhook; defaults from [notify] in the config file\n"
        "(keys cmd, url, level, per_minute" + (", desktop" if desktop else "") + "); options win.",
    )
    group.add_argument(
        "--notify-cmd", metavar="CMD",
        help="run CMD (split like a shell would, run without one) with the alert as JSON on stdin",
    )
    group.add_argument(
        "--notify-url", metavar="URL",
        help='POST the alert to a Slack-compatible webhook: {"text": ..., plus the event\'s fields}',
    )
    group.add_argument(
        "--notify-level", choices=LEVELS,
        help="the lowest severity that alerts (default warning)",
    )
    group.add_argument(
        "--notify-rate", dest="notify_per_minute", type=int, metavar="N",
        help=f"at most N alerts a minute, then one saying how many were held back "
        f"(default {DEFAULT_PER_MINUTE})",
    )
    if desktop:
        group.add_argument(
            "--notify-desktop", choices=DESKTOP_MODES,
            help="while the terminal is in the background: a desktop notification (OSC 9, default; "
            "OSC 777 for urxvt/foot), a bell, or nothing",
        )


def notify_settings(args: argparse.Namespace) -> NotifySettings:
    """The alert settings: the options of :func:`add_notify_options` over the config file's
    ``[notify]``; a one-line error for a bad value, before anything is started."""
    from tuimon.config import config_path, config_section
    from tuimon.notify.settings import resolve

    options = {
        "cmd": args.notify_cmd,
        "url": args.notify_url,
        "level": args.notify_level,
        "per_minute": args.notify_per_minute,
        "desktop": getattr(args, "notify_desktop", None),
    }
    return resolve(options, config_section("notify"), str(config_path()))


def positive_seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse reports anything else as a usage error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value
