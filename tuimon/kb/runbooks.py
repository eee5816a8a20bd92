"""Runbooks: Markdown files parsed with markdown-it-py into checklists an incident can follow.

A runbook is written for people first (it reads well on GitHub) and has a fixed shape so tuimon
can turn it into a checklist (the format is described in ``incidents/README.md``)::

    # Title
    **Applies to:** `loss_spike`, `grad_explosion`
    ## Symptom            what it looks like, how to be sure it is this
    ## First checks       numbered list: logs and metrics to look at first
    ## Likely causes      one ### per cause, most likely first, each with a list of
                          **Component:** data | model | infrastructure, **Verify:** ..., **Mitigate:** ...
    ## Escalation         list: when and to whom
    ## What to record     list: what the incident must say when it is resolved

Shipped runbooks come with tuimon; a team adds or overrides runbooks (same file name wins) in the
``runbooks`` folder of its knowledge base. A broken file is reported with its path and line and
skipped, so one bad edit never hides the other runbooks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import tuimon
from tuimon.kb.markdown import block_end, inline_texts, line_of, list_items, markdown_parser
from tuimon.kb.model import Entry
from tuimon.kb.problems import FileProblem, LineError

COMPONENTS = ("data", "model", "infrastructure")
SECTIONS = ("symptom", "first checks", "likely causes", "escalation", "what to record")
_LIST_SECTIONS = {"first checks": "check", "escalation": "escalate", "what to record": "record"}
_APPLIES = re.compile(r"\*\*Applies to:\*\*")
_FIELD = re.compile(r"\*\*(Component|Verify|Mitigate):\*\*\s*(.*)", re.DOTALL)
_KIND = re.compile(r"[a-z0-9_]+")


class RunbookError(LineError):
    """A runbook that does not follow the format."""


@dataclass(frozen=True)
class Cause:
    title: str
    component: str
    verify: str
    mitigate: str
    explanation: str
    line: int


@dataclass(frozen=True)
class RunbookStep:
    """One checklist item. ``id`` is stable while the runbook keeps its shape (``check-2``)."""

    id: str
    group: str
    text: str


@dataclass(frozen=True)
class Runbook:
    name: str
    path: Path
    title: str
    kinds: tuple[str, ...]
    symptom: str
    first_checks: tuple[str, ...]
    causes: tuple[Cause, ...]
    escalation: tuple[str, ...]
    record: tuple[str, ...]

    def steps(self) -> list[RunbookStep]:
        """The checklist: first checks, then verify/mitigate per cause, escalation, what to record."""
        steps = [
            RunbookStep(f"check-{i}", "First checks", text) for i, text in enumerate(self.first_checks, 1)
        ]
        for i, cause in enumerate(self.causes, 1):
            group = f"Cause {i}: {cause.title} ({cause.component})"
            steps.append(RunbookStep(f"cause-{i}-verify", group, f"Verify: {cause.verify}"))
            steps.append(RunbookStep(f"cause-{i}-mitigate", group, f"Mitigate: {cause.mitigate}"))
        steps += [
            RunbookStep(f"escalate-{i}", "Escalation", text) for i, text in enumerate(self.escalation, 1)
        ]
        steps += [RunbookStep(f"record-{i}", "What to record", text) for i, text in enumerate(self.record, 1)]
        return steps

    def step(self, step_id: str) -> RunbookStep | None:
        return next((step for step in self.steps() if step.id == step_id), None)












def parse_runbook(text: str, path: Path) -> Runbook:
    """Parse one runbook; raises :class:`RunbookError` naming the line of the first problem."""
    tokens = markdown_parser().parse(text)
    title = ""
    kinds: tuple[str, ...] = ()
    section: str | None = None
    section_line = 1
    symptom: list[str] = []
    lists: dict[str, list[str]] = {name: [] for name in _LIST_SECTIONS}
    causes: list[Cause] = []
    cause_head: tuple[str, int] | None = None
    cause_fields: dict[str, tuple[str, int]] = {}
    cause_text: list[str] = []
    seen_sections: set[str] = set()
    source = text.split("\n")

    def close_cause() -> None:
        nonlocal cause_head, cause_fields, cause_text
        if cause_head is None:
            return
        name, line = cause_head
        for field in ("Component", "Verify", "Mitigate"):
            if not cause_fields.get(field, ("", 0))[0]:
                raise RunbookError(line, f"cause {name!r} has no **{field}:** item")
        component, component_line = cause_fields["Component"]
        if component.lower() not in COMPONENTS:
            raise RunbookError(
                component_line,
                f"cause {name!r}: component {component!r} is not one of {', '.join(COMPONENTS)}",
            )
        causes.append(
            Cause(
                name,
                component.lower(),
                cause_fields["Verify"][0],
                cause_fields["Mitigate"][0],
                "\n\n".join(cause_text),
                line,
            )
        )
        cause_head, cause_fields, cause_text = None, {}, []

    index = 0
    while index < len(tokens):
        token = tokens[index]
        end = block_end(tokens, index)
        line = line_of(token)
        if token.type == "heading_open":
            heading = tokens[index + 1].content.strip()
            if token.tag == "h1":
                if title:
                    raise RunbookError(line, "a runbook has one '# title'")
                title = heading
            elif token.tag == "h2":
                close_cause()
                section = heading.lower()
                if section not in SECTIONS:
                    raise RunbookError(
                        line, f"unknown section {heading!r}; sections are: {', '.join(SECTIONS)}"
                    )
                if section in seen_sections:
                    raise RunbookError(line, f"section {heading!r} appears twice")
                seen_sections.add(section)
                section_line = line
            elif token.tag == "h3" and section == "likely causes":
                close_cause()
                cause_head = (heading, line)
            else:
                raise RunbookError(line, f"unexpected heading {heading!r} here")
        elif not title:
            raise RunbookError(line, "a runbook starts with a '# title' line")
        elif section is None:
            content = "\n".join(inline_texts(tokens, index, end))
            if not _APPLIES.match(content):
                raise RunbookError(
                    line, "before the first section, only '**Applies to:** `kind`, ...' is expected"
                )
            kinds = tuple(
                child.content
                for t in tokens[index:end]
                if t.type == "inline"
                for child in t.children or []
                if child.type == "code_inline"
            )
            bad = [kind for kind in kinds if not _KIND.fullmatch(kind)]
            if not kinds or bad:
                raise RunbookError(line, "'**Applies to:**' lists event kinds as `code`, e.g. `loss_spike`")
        elif section == "symptom":
            first, last = token.map or (0, 0)
            symptom.append("\n".join(source[first:last]).strip())
        elif section in _LIST_SECTIONS:
            if token.type not in ("bullet_list_open", "ordered_list_open"):
                raise RunbookError(line, f"section {section!r} holds a list of steps")
            lists[section].extend(item for _, item in list_items(tokens, index, end))
        elif section == "likely causes":
            if cause_head is None:
                raise RunbookError(line, "under 'Likely causes', each cause starts with a '### heading'")
            if token.type == "bullet_list_open":
                for item_line, item in list_items(tokens, index, end):
                    match = _FIELD.match(item)
                    if not match:
                        raise RunbookError(
                            item_line, "cause items are **Component:**, **Verify:** or **Mitigate:**"
                        )
                    cause_fields[match.group(1)] = (match.group(2).strip(), item_line)
            else:
                first, last = token.map or (0, 0)
                cause_text.append("\n".join(source[first:last]).strip())
        index = end
    close_cause()
    if not title:
        raise RunbookError(1, "empty runbook: it needs a '# title'")
    if not kinds:
        raise RunbookError(1, "no '**Applies to:** `kind`' line under the title")
    last_line = len(source)
    for name in SECTIONS:
        if name not in seen_sections:
            raise RunbookError(last_line, f"missing section '## {name.capitalize()}'")
    for name in _LIST_SECTIONS:
        if not lists[name]:
            raise RunbookError(section_line, f"section '{name}' has no steps")
    if not causes:
        raise RunbookError(section_line, "'Likely causes' has no '### cause'")
    return Runbook(
        name=path.stem,
        path=path,
        title=title,
        kinds=kinds,
        symptom="\n\n".join(symptom),
        first_checks=tuple(lists["first checks"]),
        causes=tuple(causes),
        escalation=tuple(lists["escalation"]),
        record=tuple(lists["what to record"]),
    )


@dataclass(frozen=True)
class RunbookLibrary:
    """Every runbook that loaded, by name, and the problems of those that did not."""

    runbooks: dict[str, Runbook]
    problems: tuple[FileProblem, ...]

    def for_kinds(self, kinds: Iterable[str]) -> list[Runbook]:
        wanted = list(kinds)
        return [
            runbook
            for runbook in sorted(self.runbooks.values(), key=lambda rb: rb.name)
            if any(kind in runbook.kinds for kind in wanted)
        ]

    def kinds(self) -> set[str]:
        return {kind for runbook in self.runbooks.values() for kind in runbook.kinds}


def shipped_runbooks_dir() -> Path:
    """Runbooks shipped with tuimon: inside the wheel, or ``incidents/runbooks`` in a checkout."""
    package = Path(tuimon.__file__).parent
    installed = package / "_data" / "runbooks"
    return installed if installed.is_dir() else package.parent / "incidents" / "runbooks"


def load_runbooks(folders: Iterable[Path]) -> RunbookLibrary:
    """Load ``*.md`` from each folder in turn; a later folder's file overrides one of the same name."""
    files: dict[str, Path] = {}
    for folder in folders:
        if folder.is_dir():
            for path in sorted(folder.glob("*.md")):
                if path.name.lower() != "readme.md":
                    files[path.stem] = path
    runbooks: dict[str, Runbook] = {}
    problems: list[FileProblem] = []
    for name, path in sorted(files.items()):
        try:
            runbooks[name] = parse_runbook(path.read_text(encoding="utf-8"), path)
        except RunbookError as exc:
            problems.append(FileProblem(path, exc.line, str(exc)))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(FileProblem(path, 1, f"cannot read: {exc}"))
    return RunbookLibrary(runbooks, tuple(problems))


# -- progress of an incident through a runbook ------------------------------------------------


@dataclass(frozen=True)
class StepState:
    step: RunbookStep
    checked: bool
    by: str | None
    at: str | None


@dataclass(frozen=True)
class RunbookProgress:
    runbook: Runbook
    steps: tuple[StepState, ...]

    @property
    def done(self) -> int:
        return sum(state.checked for state in self.steps)


def progress(runbook: Runbook, entries: Iterable[Entry]) -> RunbookProgress:
    """Which steps are ticked: the latest "runbook_step" entry for each step decides."""
    latest: dict[str, Entry] = {}
    for entry in entries:
        data = entry.data or {}
        if entry.type == "runbook_step" and data.get("runbook") == runbook.name:
            latest[str(data.get("step"))] = entry
    states = []
    for step in runbook.steps():
        entry = latest.get(step.id)
        checked = bool(entry is not None and (entry.data or {}).get("checked"))
        states.append(
            StepState(step, checked, entry.author if entry else None, entry.time if entry else None)
        )
    return RunbookProgress(runbook, tuple(states))
