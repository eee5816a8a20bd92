"""``tuimon incidents sync``: one knowledge base shared across hosts through a git repository.

The database must stay on a local disk (SQLite's WAL mode needs shared memory, which network
filesystems do not give: https://www.sqlite.org/wal.html), so hosts share Markdown exports in a
git working copy instead: export what this host has that the copy lacks, commit those files,
``git pull --rebase``, import what others wrote, push.

Incident numbers are per knowledge base (the UUID identifies an incident), so an incident is only
exported when this knowledge base holds something its file lacks: re-exporting every incident
would rewrite the number in every file another host numbered differently, and two hosts would
rewrite each other's files on every sync. When the rebase stops on a file both sides changed,
the two versions are merged as parsed incidents (:mod:`tuimon.kb.merge3`) rather than lines;
what cannot be merged aborts the rebase before anything is written, so the knowledge base and
the working copy stay as they were.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuimon.config import config_path, config_section
from tuimon.errors import UserError
from tuimon.kb import merge3
from tuimon.kb.api import ImportReport, KnowledgeBase
from tuimon.kb.export import ExportFolder, ExportReport, render
from tuimon.kb.gitrepo import WorkingCopy, reason
from tuimon.kb.markdown_import import ParsedIncident, ParseError, parse_file, parse_incident
from tuimon.kb.model import TEXT_FIELD_LABELS, ContextRecord, Entry, Incident
from tuimon.kb.problems import FileProblem

#: The folder of the working copy that holds the incident files, unless ``--folder`` says otherwise.
DEFAULT_FOLDER = "incidents"
#: ``sync_repo = "DIR"`` in the ``[kb]`` table of the config file names the working copy.
CONFIG_SECTION = "kb"
REPO_KEY = "sync_repo"
#: The versions of a conflicted file, by index stage, while rebasing.
_SIDES = {1: "common", 2: "upstream", 3: "local"}


class SyncConflict(UserError):
    """Changes a sync cannot merge; the rebase was aborted and nothing was changed."""


@dataclass
class SyncReport:
    """What one sync did, step by step."""

    folder: Path
    exported: list[Path] = field(default_factory=list)
    commit: str | None = None
    pulled_commits: int = 0
    imported: ImportReport = field(default_factory=ImportReport)
    pushed: bool = False
    unpushed_commits: int = 0
    problems: dict[str, FileProblem] = field(default_factory=dict)

    @property
    def from_others(self) -> int:
        """Incidents the pull brought that were new here or held something new."""
        return len(self.imported.imported)


def sync_repo(cli_value: Path | None, env: Mapping[str, str] = os.environ) -> Path:
    """The working copy: ``--repo``, else ``sync_repo`` in the config file's ``[kb]`` table (a
    relative path is relative to the config file's folder, like ``kb_dir``)."""
    if cli_value is not None:
        return cli_value.expanduser()
    value = config_section(CONFIG_SECTION, env).get(REPO_KEY)
    config = config_path(env)
    if value is None:
        raise UserError(
            f'say which git working copy to sync through: --repo DIR, or {REPO_KEY} = "DIR" '
            f"in the [{CONFIG_SECTION}] table of {config}"
        )
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{config}: [{CONFIG_SECTION}] {REPO_KEY} must be a folder path (a non-empty string)")
    path = Path(value).expanduser()
    return path if path.is_absolute() else config.parent / path


def sync(
    kb: KnowledgeBase,
    repo: Path,
    *,
    folder: str | None = None,
    push: bool = True,
    say: Callable[[str], None] = lambda line: None,
) -> SyncReport:
    """Export, commit, pull (rebasing), import and push; ``say`` gets one line per step.

    ``folder`` is relative to the working copy's top (default :data:`DEFAULT_FOLDER`)."""
    copy = WorkingCopy.open(repo, fallback_author=kb.author)
    target = _folder_in(copy.root, folder or DEFAULT_FOLDER)
    shown = f"{target.relative_to(copy.root)}/"
    report = SyncReport(target)
    files = _read_folder(target, report.problems)
    caught_up = _import_news(kb, files)
    if caught_up.imported:
        say(f"imported {len(caught_up.imported)} incidents the working copy had and this KB lacked")
    exported = _export_news(kb, target, files)
    report.exported = [*exported.written, *exported.removed]
    say(f"exported {len(report.exported)} changed files into {shown}")
    report.commit = _commit(copy, target)
    say(f"committed {report.commit}" if report.commit else "nothing new to commit")
    report.pulled_commits = _pull(kb, copy, target)
    report.imported = _import_news(kb, _read_folder(target, report.problems))
    say(
        f"pulled {report.pulled_commits} commits from {copy.upstream}: "
        f"{report.from_others} new or changed incidents from others"
    )
    entries = sum(outcome.entries_added for _, outcome in report.imported.imported)
    created = sum(outcome.created for _, outcome in report.imported.imported)
    say(f"imported {created} new incidents and {entries} timeline entries")
    report.unpushed_commits = _ahead(copy)
    if push and report.unpushed_commits:
        _push(copy)
        report.pushed, report.unpushed_commits = True, 0
        say(f"pushed to {copy.upstream}")
    elif report.unpushed_commits:
        say(f"not pushed (--no-push): {report.unpushed_commits} commits wait for the next sync")
    else:
        say("nothing to push")
    return report


# -- the working copy's incident files ------------------------------------------------------------


def _folder_in(root: Path, folder: str) -> Path:
    path = (root / folder).resolve()
    if root not in path.parents:
        raise UserError(f"the incident folder {folder!r} must be a folder inside the working copy {root}")
    return path


def _read_folder(folder: Path, problems: dict[str, FileProblem]) -> dict[str, tuple[Path, ParsedIncident]]:
    """Every incident file of ``folder``, parsed: id -> (path, version). A file that does not parse
    is recorded in ``problems`` (and skipped, as import skips it)."""
    found = {}
    for path in ExportFolder(folder).paths.values():
        try:
            parsed = parse_file(path)
        except (ParseError, OSError) as exc:
            line, message = (
                (exc.line, str(exc)) if isinstance(exc, ParseError) else (1, f"cannot read: {exc}")
            )
            problem = FileProblem(path, line, message)
            problems[str(problem)] = problem
            continue
        found[parsed.incident.id] = (path, parsed)
    return found


@dataclass(frozen=True)
class _Holding:
    """What one version of an incident holds, as far as it matters to whether the other has news."""

    updated_at: str
    entries: frozenset[str]
    context: frozenset[str]

    @classmethod
    def of(cls, incident: Incident, entries: Sequence[Entry], context: Sequence[ContextRecord]) -> _Holding:
        return cls(incident.updated_at, frozenset(e.id for e in entries), frozenset(r.id for r in context))

    def news_for(self, other: _Holding | None) -> bool:
        """Whether importing (or exporting) this version would change ``other``: fields updated
        later, or entries or context it lacks. The number is not news (it is per knowledge base)."""
        return (
            other is None
            or self.updated_at > other.updated_at
            or not self.entries <= other.entries
            or not self.context <= other.context
        )


def _holdings(kb: KnowledgeBase) -> dict[str, tuple[int, _Holding]]:
    return {
        incident.id: (
            incident.number,
            _Holding.of(incident, kb.timeline(incident.number), kb.context(incident.number)),
        )
        for incident in kb.list_incidents(limit=None)
    }


def _import_news(kb: KnowledgeBase, files: dict[str, tuple[Path, ParsedIncident]]) -> ImportReport:
    """Import the files that hold something this knowledge base lacks (the import merges by id)."""
    held = _holdings(kb)
    return kb.import_files(
        [
            path
            for incident_id, (path, parsed) in files.items()
            if _Holding.of(*_parts(parsed)).news_for(held.get(incident_id, (0, None))[1])
        ]
    )


def _export_news(
    kb: KnowledgeBase, folder: Path, files: dict[str, tuple[Path, ParsedIncident]]
) -> ExportReport:
    """Export the incidents that hold something their file lacks (or that have no file yet)."""
    in_files = {incident_id: _Holding.of(*_parts(parsed)) for incident_id, (_, parsed) in files.items()}
    numbers = [
        number
        for incident_id, (number, held) in _holdings(kb).items()
        if held.news_for(in_files.get(incident_id))
    ]
    return kb.export(folder, numbers) if numbers else ExportReport()


def _parts(parsed: ParsedIncident) -> tuple[Incident, Sequence[Entry], Sequence[ContextRecord]]:
    return parsed.incident, parsed.entries, parsed.context


# -- git ------------------------------------------------------------------------------------------


def _changed_files(copy: WorkingCopy, folder: Path) -> list[str]:
    """Incident files of ``folder`` (not its subfolders) that differ from the index: written,
    removed, new or in conflict."""
    listed = copy.run(
        "ls-files", "--modified", "--deleted", "--others", "--exclude-standard", "-z", "--", str(folder)
    )
    return [
        path
        for path in dict.fromkeys(filter(None, listed.split("\0")))
        if (copy.root / path).parent == folder and path.endswith(".md")
    ]


def _commit(copy: WorkingCopy, folder: Path) -> str | None:
    """Commit the folder's changed incident files, and only them; None when there were none."""
    paths = _changed_files(copy, folder)
    if not paths:
        return None
    _stage(copy, paths)
    message = f"tuimon incidents sync from {socket.gethostname()}: {len(paths)} incident files"
    copy.run("commit", "--quiet", "--message", message, "--", *paths)
    return copy.run("log", "-1", "--format=%h %s").strip()


def _stage(copy: WorkingCopy, paths: Sequence[str]) -> None:
    """``git add`` these files, removals included; never without paths (that would add everything)."""
    if paths:
        copy.run("add", "--all", "--", *paths)


def _pull(kb: KnowledgeBase, copy: WorkingCopy, folder: Path) -> int:
    """``git pull --rebase`` as its two steps, so that an upstream branch that does not exist yet
    (the first sync into an empty repository) means nothing to pull, not an error. Returns how
    many commits came in."""
    copy.run("fetch", "--quiet", copy.upstream.remote)
    if not copy.succeeds("rev-parse", "--quiet", "--verify", "@{upstream}"):
        return 0
    head = copy.head()
    incoming = int(copy.run("rev-list", "--count", f"{head}..@{{upstream}}" if head else "@{upstream}"))
    if not incoming:
        return 0
    if head is None:
        copy.run("merge", "--ff-only", "--quiet", "@{upstream}")
        return incoming
    done = copy.attempt("rebase")
    while copy.rebasing():
        conflicted = copy.conflicts()
        if not conflicted:
            copy.run("rebase", "--abort")
            raise UserError(f"git rebase stopped in {copy.root} ({reason(done)}); it was aborted")
        _resolve(kb, copy, folder, conflicted)
        _stage(copy, _changed_files(copy, folder))
        if copy.conflicts():
            copy.run("rebase", "--abort")
            raise UserError(f"could not resolve the conflicts in {copy.root}; the rebase was aborted")
        # A resolution equal to upstream leaves nothing to commit: that commit is skipped.
        step = "--skip" if copy.succeeds("diff", "--cached", "--quiet") else "--continue"
        done = copy.attempt("rebase", step, env={"GIT_EDITOR": "true"})
    if done.returncode != 0:
        raise UserError(f"git pull --rebase failed in {copy.root}: {reason(done)}")
    return incoming


def _ahead(copy: WorkingCopy) -> int:
    """Commits here that the upstream branch lacks (all of them while it does not exist)."""
    if copy.head() is None:
        return 0
    upstream = copy.succeeds("rev-parse", "--quiet", "--verify", "@{upstream}")
    return int(copy.run("rev-list", "--count", "@{upstream}..HEAD" if upstream else "HEAD"))


def _push(copy: WorkingCopy) -> None:
    done = copy.attempt("push", "--porcelain", copy.upstream.remote, f"HEAD:{copy.upstream.ref}")
    if done.returncode == 0:
        return
    refused = [line.split("\t")[-1] for line in done.stdout.splitlines() if line.startswith("!")]
    if refused:
        why = refused[0]
        hint = (
            "someone pushed meanwhile, run tuimon incidents sync again"
            if why.startswith("[rejected]")
            else "the remote refused it"
        )
        raise UserError(f"push to {copy.upstream} was rejected {why}: {hint}")
    raise UserError(f"git push to {copy.upstream} failed: {reason(done)}")


# -- conflicts ------------------------------------------------------------------------------------


def _resolve(
    kb: KnowledgeBase, copy: WorkingCopy, folder: Path, conflicted: dict[str, dict[int, str]]
) -> None:
    """Replace each conflicted incident file by the merge of its versions, or abort the rebase and
    raise `SyncConflict` when one cannot be merged (before anything is written)."""
    problems: list[str] = []
    sides, where = _conflict_sides(copy, folder, conflicted, problems)
    known = {incident.id: incident for incident in kb.list_incidents(limit=None)}
    moved = {
        incident_id: path
        for incident_id, path in ExportFolder(folder).paths.items()
        if str(path.relative_to(copy.root)) not in conflicted
    }
    resolved: list[ParsedIncident] = []
    for incident_id, path in where.items():
        # Upstream's version; when upstream moved it to another file (renumbered), that file's.
        theirs = sides[2].get(incident_id) or _parsed(moved.get(incident_id))
        mine = _local_version(kb, known[incident_id]) if incident_id in known else sides[3].get(incident_id)
        if mine is None or theirs is None:
            resolved += [version for version in (mine, theirs) if version is not None]
            continue
        base = sides[1].get(incident_id)
        merged = merge3.merge(base.incident if base else None, mine, theirs, kb.author)
        if merged.version is not None:
            resolved.append(merged.version)
            continue
        labels = ", ".join(TEXT_FIELD_LABELS[name].lower() for name in merged.conflicts)
        problems.append(
            f"{path}: both sides changed the {labels} of {mine.incident.ref} {mine.incident.title!r} "
            f"(here by {mine.incident.updated_by}, upstream by {theirs.incident.updated_by})"
        )
    if problems:
        copy.run("rebase", "--abort")
        raise SyncConflict(
            "cannot merge what others pushed; the rebase was aborted and this knowledge base and "
            f"{copy.root} are as they were:\n  " + "\n  ".join(problems) + "\nmake the text the same on "
            "one side (git show @{upstream}:PATH shows the other's), then sync again"
        )
    for path in conflicted:
        (copy.root / path).unlink(missing_ok=True)
    target = ExportFolder(folder)
    # Incidents new to this host first, so that they keep the file names others gave them.
    for version in sorted(resolved, key=lambda version: version.incident.id in known):
        target.write(
            version.incident, render(version.incident, version.entries, version.context, kb.runbooks)
        )


def _conflict_sides(
    copy: WorkingCopy, folder: Path, conflicted: dict[str, dict[int, str]], problems: list[str]
) -> tuple[dict[int, dict[str, ParsedIncident]], dict[str, str]]:
    """Each conflicted file's versions, parsed: stage -> incident id -> version; and which file
    each incident of the upstream or local side is in. What cannot be read goes to ``problems``."""
    sides: dict[int, dict[str, ParsedIncident]] = {stage: {} for stage in _SIDES}
    where: dict[str, str] = {}
    for path, stages in conflicted.items():
        if (copy.root / path).parent != folder:
            problems.append(
                f"{path}: changed on both sides, and not a file tuimon merges (resolve it with git)"
            )
            continue
        for stage, object_id in sorted(stages.items()):
            try:
                parsed = parse_incident(copy.blob(object_id).decode("utf-8"))
            except UnicodeDecodeError:
                problems.append(f"{path} ({_SIDES[stage]} version): not UTF-8 text")
                continue
            except ParseError as exc:
                problems.append(f"{path}:{exc.line} ({_SIDES[stage]} version): {exc}")
                continue
            sides[stage][parsed.incident.id] = parsed
            if stage != 1:
                where.setdefault(parsed.incident.id, path)
    return sides, where


def _parsed(path: Path | None) -> ParsedIncident | None:
    if path is None:
        return None
    try:
        return parse_file(path)
    except (ParseError, OSError):
        return None


def _local_version(kb: KnowledgeBase, incident: Incident) -> ParsedIncident:
    return ParsedIncident(incident, tuple(kb.timeline(incident.number)), tuple(kb.context(incident.number)))
