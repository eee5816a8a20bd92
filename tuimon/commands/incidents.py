"""``tuimon incidents``: the incident knowledge base from the command line.

Every subcommand takes ``--kb DIR`` (else ``$TUIMON_KB``, the config file's ``kb_dir``, or the
default); writes take ``--author`` (else ``$TUIMON_AUTHOR``, else the Unix user). ``ID`` is an
incident number (``12`` or ``#12``), a UUID or a unique UUID prefix. Only the standard library is
imported at module level (``tuimon --help`` stays instant); the knowledge base loads in handlers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuimon.commands._options import add_kb_option

if TYPE_CHECKING:
    from tuimon.kb import Incident, KnowledgeBase
    from tuimon.kb.incidents import IncidentFilter

# Allowed values are checked by tuimon.kb.model when the handler runs (one list, one error
# message); the help texts name them for the reader.
STATUS_HELP = "open, investigating, mitigated or resolved"
#: A subcommand's own arguments (added to its parser), and its handler (returns the exit status).
Arguments = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]
SEVERITY_HELP = "info, warning or critical"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "incidents",
        help="incident knowledge base: notes, runbooks, search, Markdown export",
        description="Open incidents, record what was tried, follow runbooks, search past incidents, "
        "and export them to Markdown. See docs/incidents.md.",
    )
    commands = parser.add_subparsers(dest="incidents_command", metavar="ACTION", required=True)
    common = argparse.ArgumentParser(add_help=False)
    add_kb_option(common)
    common.add_argument("--author", help="who writes (default: $TUIMON_AUTHOR, else your user name)")
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    for name, help_text, arguments, handler in _SUBCOMMANDS:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        arguments(sub)
        sub.set_defaults(handler=handler)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", action="append", default=[], help=f"{STATUS_HELP} (repeatable)")
    parser.add_argument("--kind", action="append", default=[], help="event kind (repeatable)")
    parser.add_argument("--tag", action="append", default=[], help="tag (repeatable)")
    parser.add_argument("--run", help="run name")
    parser.add_argument("--since", metavar="DATE", help="created on or after (YYYY-MM-DD[THH:MM])")
    parser.add_argument("--until", metavar="DATE", help="created on or before (YYYY-MM-DD[THH:MM])")


# -- helpers -------------------------------------------------------------------------------------


def _open(args: argparse.Namespace) -> KnowledgeBase:
    from tuimon.kb import KnowledgeBase

    return KnowledgeBase.open(args.kb, author=args.author)


def _text(value: str) -> str:
    """``value``, or standard input for ``-`` (which must be UTF-8 text)."""
    if value != "-":
        return value
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        from tuimon.errors import UserError

        raise UserError(f"standard input is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _filter(args: argparse.Namespace) -> IncidentFilter:
    from tuimon.kb.incidents import IncidentFilter
    from tuimon.kb.model import STATUSES, choice, labels, parse_date

    return IncidentFilter(
        statuses=tuple(choice(status, STATUSES, "status") for status in args.status),
        kinds=labels(args.kind, "kind"),
        tags=labels(args.tag, "tag"),
        run=args.run,
        since=parse_date(args.since) if args.since else None,
        until=parse_date(args.until, end=True) if args.until else None,
    )


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _row(incident: Incident) -> str:
    kinds = ",".join(incident.kinds) or "-"
    return (
        f"#{incident.number:<5} {incident.status:<13} {incident.severity:<8} {kinds[:24]:<24} "
        f"{incident.updated_at[:16].replace('T', ' ')}  {incident.title}"
    )


def _highlighter() -> tuple[str, str]:
    """Bold on a terminal (unless NO_COLOR), brackets in files and pipes."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return "\033[1;4m", "\033[0m"
    return "[", "]"


# -- handlers ------------------------------------------------------------------------------------


def _args_new(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--title", help="one line (default with --recording: the event's kind, step and run)")
    parser.add_argument("--kind", action="append", default=[], help="event kind (repeatable)")
    parser.add_argument("--severity", help=f"{SEVERITY_HELP} (default: the event's, else warning)")
    parser.add_argument("--run", help="run name")
    parser.add_argument("--host", help="host name")
    parser.add_argument("--rank", type=int, action="append", default=[], help="rank involved (repeatable)")
    parser.add_argument("--steps", metavar="FIRST[-LAST]", help="step or step range")
    parser.add_argument("--tag", action="append", default=[], help="tag (repeatable, or comma-separated)")
    parser.add_argument("--summary", default="", help="what happened, in a few sentences")
    parser.add_argument(
        "--recording",
        metavar="RECORDING",
        help="open from an event of a recording (a .jsonl file, the PREFIX of `tuimon run --record "
        "PREFIX`, or a folder of them), capturing its context",
    )
    parser.add_argument("--event", metavar="EVENT_ID", help="with --recording: the event's id (e.g. 0-17)")
    parser.add_argument("--window", type=int, default=50, help="steps of metrics kept each side (default 50)")


def _new(args: argparse.Namespace) -> int:
    from tuimon.errors import UserError
    from tuimon.kb import IncidentDraft
    from tuimon.kb.model import parse_steps

    if (args.recording is None) != (args.event is None):
        raise UserError("--recording and --event go together")
    with _open(args) as kb:
        if args.recording is not None:
            incident = kb.open_from_recording(
                args.recording,
                args.event,
                window=args.window,
                title=args.title,
                tags=args.tag,
                summary=args.summary,
                severity=args.severity,
            )
            if args.kind:
                incident = kb.update(incident.number, add_kinds=args.kind)
        else:
            if not args.title:
                raise UserError("give --title (or --recording FILE --event ID)")
            first, last = parse_steps(args.steps or "")
            incident = kb.open_incident(
                IncidentDraft(
                    title=args.title,
                    kinds=args.kind,
                    severity=args.severity or "warning",
                    run=args.run,
                    host=args.host,
                    ranks=args.rank,
                    step_first=first,
                    step_last=last,
                    tags=args.tag,
                    summary=args.summary,
                )
            )
        if args.json:
            _print_json(incident.to_json())
        else:
            print(incident.number)
    return 0


def _args_list(parser: argparse.ArgumentParser) -> None:
    _filters(parser)
    parser.add_argument("--limit", type=int, default=50, help="at most this many (default 50, 0: all)")


def _list(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        found = kb.list_incidents(_filter(args), limit=args.limit or None)
        if args.json:
            _print_json([incident.to_json() for incident in found])
        elif not found:
            print("no incidents match" if _filter(args).active else f"no incidents yet in {kb.location.path}")
        else:
            for incident in found:
                print(_row(incident))
    return 0


def _args_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")


def _show(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        if args.json:
            number = kb.resolve(args.id)
            _print_json(
                {
                    "incident": kb.get(number).to_json(),
                    "timeline": [entry.to_json() for entry in kb.timeline(number)],
                    "context": [record.to_json() for record in kb.context(number)],
                    "runbooks": [
                        {
                            "runbook": state.runbook.name,
                            "steps": [
                                {
                                    "id": s.step.id,
                                    "group": s.step.group,
                                    "text": s.step.text,
                                    "checked": s.checked,
                                    "by": s.by,
                                    "at": s.at,
                                }
                                for s in state.steps
                            ],
                        }
                        for state in kb.progress(number)
                    ],
                }
            )
        else:
            sys.stdout.write(kb.render(args.id))
    return 0


def _args_search(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query", nargs="+", metavar="QUERY")
    _filters(parser)
    parser.add_argument("--limit", type=int, default=20, help="at most this many results (default 20)")


def _search(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        hits = kb.search(" ".join(args.query), where=_filter(args), limit=args.limit)
        if args.json:
            _print_json(
                [
                    {
                        "incident": hit.incident.to_json(),
                        "score": hit.score,
                        "matched": hit.matched,
                        "snippet": hit.snippet.marked(),
                        "entry_id": hit.entry_id,
                        "outcome": hit.outcome,
                    }
                    for hit in hits
                ]
            )
            return 0
        if not hits:
            print("no matches")
        opening, closing = _highlighter()
        for hit in hits:
            print(_row(hit.incident))
            where = hit.matched + (f" ({hit.outcome.replace('_', ' ')})" if hit.outcome else "")
            print(f"        {where}: {hit.snippet.marked(opening, closing)}")
    return 0


def _print_entry(args: argparse.Namespace, entry: Any) -> None:
    if args.json:
        _print_json(entry.to_json())
    else:
        print(f"added {entry.type.replace('_', ' ')} to #{entry.incident}")


def _args_add_note(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")
    parser.add_argument("text", metavar="TEXT")
    parser.add_argument("--result", action="store_true", help="record it as a result (what was observed)")


def _add_note(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        text = _text(args.text)
        entry = kb.add_result(args.id, text) if args.result else kb.add_note(args.id, text)
        _print_entry(args, entry)
    return 0


def _args_tried(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")
    parser.add_argument("text", metavar="TEXT")
    parser.add_argument(
        "--outcome", default="unknown", help="helped, no-effect, made-worse or unknown (default)"
    )
    parser.add_argument("--step", type=int, help="training step at which it was applied")


def _tried(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        _print_entry(args, kb.add_tried(args.id, _text(args.text), args.outcome, step=args.step))
    return 0


def _args_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")
    parser.add_argument("status", metavar="STATUS", help=STATUS_HELP)
    parser.add_argument("--note", default="", help="why (added to the status-change entry)")


def _status(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        entry = kb.set_status(args.id, args.status, note=args.note)
        if entry is None:
            incident = kb.get(args.id)
            print(f"#{incident.number} is already {incident.status}")
        else:
            _print_entry(args, entry)
    return 0


def _args_edit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")
    parser.add_argument("--title")
    parser.add_argument("--severity", help=SEVERITY_HELP)
    parser.add_argument("--run")
    parser.add_argument("--host")
    for field in ("summary", "trigger", "detection", "root-cause", "resolution"):
        parser.add_argument(f"--{field}", metavar="TEXT", help="'-' reads it from stdin")
    parser.add_argument("--tag", action="append", default=[], help="add a tag (repeatable)")
    parser.add_argument("--untag", action="append", default=[], help="remove a tag (repeatable)")
    parser.add_argument("--kind", action="append", default=[], help="add an event kind (repeatable)")


def _edit(args: argparse.Namespace) -> int:
    fields = {
        name: _text(value) if name not in ("title", "severity", "run", "host") else value
        for name, value in (
            ("title", args.title),
            ("severity", args.severity),
            ("run", args.run),
            ("host", args.host),
            ("summary", args.summary),
            ("trigger", args.trigger),
            ("detection", args.detection),
            ("root_cause", args.root_cause),
            ("resolution", args.resolution),
        )
        if value is not None
    }
    with _open(args) as kb:
        incident = kb.update(
            args.id, add_tags=args.tag, remove_tags=args.untag, add_kinds=args.kind, **fields
        )
        if args.json:
            _print_json(incident.to_json())
        else:
            print(f"updated #{incident.number}")
    return 0


def _args_tick(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID")
    parser.add_argument("step", metavar="STEP", help="step id, e.g. check-2 (see 'tuimon incidents show')")
    parser.add_argument("--runbook", help="runbook name (needed when several runbooks match)")
    parser.add_argument("--undo", action="store_true", help="untick the step")


def _tick(args: argparse.Namespace) -> int:
    from tuimon.errors import UserError

    with _open(args) as kb:
        name = args.runbook
        if name is None:
            states = kb.progress(args.id)
            having = [s.runbook.name for s in states if s.runbook.step(args.step) is not None]
            if len(having) != 1:
                choices = ", ".join(s.runbook.name for s in states) or "none match this incident's kinds"
                raise UserError(f"say which runbook with --runbook ({choices})")
            name = having[0]
        _print_entry(args, kb.tick_step(args.id, name, args.step, checked=not args.undo))
    return 0


def _args_similar(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="+", metavar="KIND")
    parser.add_argument("--limit", type=int, default=5)


def _similar(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        seen = kb.seen_before(args.kind, limit=args.limit)
        if args.json:
            _print_json(
                {
                    "kinds": list(seen.kinds),
                    "total": seen.total,
                    "resolved": seen.resolved,
                    "incidents": [incident.to_json() for incident in seen.incidents],
                    "remedies": [
                        {
                            "text": r.text,
                            "outcome": r.outcome,
                            "times": r.times,
                            "incidents": list(r.incidents),
                        }
                        for r in seen.remedies
                    ],
                }
            )
            return 0
        print(seen.headline())
        for incident in seen.incidents:
            print(_row(incident))
        for remedy in seen.remedies:
            where = ", ".join(f"#{n}" for n in remedy.incidents)
            print(f"  {remedy.outcome.replace('_', ' '):<11} {remedy.times}x  {remedy.text}  ({where})")
    return 0


def _args_runbooks(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", metavar="NAME")


def _runbooks(args: argparse.Namespace) -> int:
    from tuimon.errors import UserError

    with _open(args) as kb:
        library = kb.runbooks
        if args.name:
            book = library.runbooks.get(args.name)
            if book is None:
                raise UserError(f"no runbook {args.name!r} (see 'tuimon incidents runbooks')")
            if args.json:
                _print_json([{"id": s.id, "group": s.group, "text": s.text} for s in book.steps()])
            else:
                print(f"{book.title}  ({book.path})")
                group = None
                for step in book.steps():
                    if step.group != group:
                        group = step.group
                        print(f"\n{group}")
                    print(f"  [ ] {step.id:<18} {' '.join(step.text.split())}")
            return 0
        if args.json:
            _print_json(
                {
                    "runbooks": [
                        {"name": b.name, "title": b.title, "kinds": list(b.kinds), "path": str(b.path)}
                        for b in library.runbooks.values()
                    ],
                    "problems": [str(problem) for problem in library.problems],
                }
            )
        else:
            for book in library.runbooks.values():
                print(f"{book.name:<22} {', '.join(book.kinds):<28} {book.title}")
            for problem in library.problems:
                print(f"tuimon: skipped runbook {problem}", file=sys.stderr)
    return 1 if library.problems else 0


def _args_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    parser.add_argument("ids", nargs="*", metavar="ID")


def _export(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        show_progress = sys.stderr.isatty() and not args.json

        def progress(done: int, total: int) -> None:
            if show_progress and (done == total or done % 100 == 0):
                print(
                    f"\rexported {done}/{total}",
                    end="\n" if done == total else "",
                    file=sys.stderr,
                    flush=True,
                )

        report = kb.export(args.out, args.ids, on_progress=progress)
        if args.json:
            _print_json(
                {
                    name: [str(p) for p in getattr(report, name)]
                    for name in ("written", "unchanged", "removed")
                }
            )
        else:
            print(
                f"{len(report.written)} written, {len(report.unchanged)} unchanged, "
                f"{len(report.removed)} renamed away, in {args.out}"
            )
    return 0


def _args_import(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")


def _import(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        report = kb.import_files(args.paths)
        created = sum(outcome.created for _, outcome in report.imported)
        entries = sum(outcome.entries_added for _, outcome in report.imported)
        updated = sum(outcome.fields_updated for _, outcome in report.imported)
        if args.json:
            _print_json(
                {
                    "imported": [
                        {
                            "path": str(path),
                            "number": o.number,
                            "created": o.created,
                            "fields_updated": o.fields_updated,
                            "entries_added": o.entries_added,
                            "context_added": o.context_added,
                        }
                        for path, o in report.imported
                    ],
                    "problems": [str(problem) for problem in report.problems],
                }
            )
        else:
            print(
                f"{len(report.imported)} files read: {created} new incidents, {updated} updated, "
                f"{entries} timeline entries added"
            )
        for problem in report.problems:
            print(f"tuimon: skipped {problem}", file=sys.stderr)
    return 1 if report.problems else 0


def _args_sync(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Share this knowledge base with other hosts through a git working copy: export the incidents "
        "this knowledge base holds something new of into the copy's incident folder, commit those "
        "files, git pull --rebase, import what others wrote (merged by id: everybody's timeline "
        "entries are kept), and push. When two hosts changed one incident, the versions are merged; "
        "if both changed the same text field differently, nothing is changed and the sync stops "
        "(exit status 2) naming the file and the field. Exit status 1: some files did not parse."
    )
    parser.add_argument(
        "--repo",
        type=Path,
        metavar="DIR",
        help="git working copy with an upstream branch to share through (default: sync_repo in the [kb] "
        "table of the config file)",
    )
    parser.add_argument(
        "--folder",
        metavar="PATH",
        help="folder inside the working copy for the incident files (default: incidents)",
    )
    parser.add_argument(
        "--no-push",
        dest="push",
        action="store_false",
        help="do everything but push (a dry run for others: the commit goes out with the next sync)",
    )


def _sync(args: argparse.Namespace) -> int:
    from tuimon.kb.sync import sync, sync_repo

    repo = sync_repo(args.repo)
    with _open(args) as kb:
        say = (lambda line: None) if args.json else print
        report = sync(kb, repo, folder=args.folder, push=args.push, say=say)
    problems = [str(problem) for problem in report.problems.values()]
    if args.json:
        _print_json(
            {
                "folder": str(report.folder),
                "exported": [str(path) for path in report.exported],
                "commit": report.commit,
                "pulled_commits": report.pulled_commits,
                "from_others": report.from_others,
                "pushed": report.pushed,
                "unpushed_commits": report.unpushed_commits,
                "problems": problems,
            }
        )
    else:
        if report.pushed:
            pushed = "pushed"
        elif report.unpushed_commits:
            pushed = f"{report.unpushed_commits} commits not pushed"
        else:
            pushed = "nothing to push"
        print(
            f"synced {report.folder}: {len(report.exported)} files exported, {report.from_others} "
            f"incidents from others, {pushed}"
        )
    for problem in problems:
        print(f"tuimon: skipped {problem}", file=sys.stderr)
    return 1 if problems else 0


def _where(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        info = {
            "path": str(kb.location.path),
            "database": str(kb.location.db_path),
            "chosen_by": kb.location.source,
            "runbooks": str(kb.location.runbooks_dir),
            "schema_version": kb.schema_version,
            "incidents": kb.count(),
            "author": kb.author,
        }
        if args.json:
            _print_json(info)
        else:
            for key, value in info.items():
                print(f"{key.replace('_', ' ') + ':':<16} {value}")
    return 0


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A subcommand with only the common options."""


#: Every subcommand: name, help, its arguments, its handler (the order of ``--help``).
_SUBCOMMANDS: list[tuple[str, str, Arguments, Handler]] = [
    ("new", "open an incident and print its number", _args_new, _new),
    ("list", "list incidents, most recently active first", _args_list, _list),
    ("show", "show one incident as Markdown (or JSON)", _args_show, _show),
    ("search", 'full-text search: words, "exact phrases", prefix*, OR, NOT', _args_search, _search),
    ("add-note", "add a note to the timeline ('-' reads it from stdin)", _args_add_note, _add_note),
    ("tried", "record something tried and its outcome", _args_tried, _tried),
    ("status", "change an incident's status", _args_status, _status),
    ("edit", "change fields and tags of an incident", _args_edit, _edit),
    ("tick", "tick (or untick) a runbook step of an incident", _args_tick, _tick),
    ("similar", "past incidents of these kinds and what helped", _args_similar, _similar),
    (
        "runbooks", "list runbooks (and broken runbook files), or show one as a checklist",
        _args_runbooks, _runbooks,
    ),
    ("export", "write incidents as Markdown files (all of them if no ID)", _args_export, _export),
    ("import", "merge exported Markdown files (folders or files) by incident id", _args_import, _import),
    (
        "sync", "share incidents with other hosts through git: export, commit, pull, import, push",
        _args_sync, _sync,
    ),
    ("where", "show which knowledge base is used and why", _no_arguments, _where),
]
