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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from markdown_it.token import Token

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
    reader = _RunbookReader(text)
    tokens = markdown_parser().parse(text)
    index = 0
    while index < len(tokens):
        end = block_end(tokens, index)
        reader.read_block(tokens, index, end)
        index = end
    return reader.finish(path)


class _RunbookReader:
    """Reads a runbook's blocks in order; each section's blocks go to that section's reader."""

    def __init__(self, text: str) -> None:
        self.source = text.split("\n")
        self.title = ""
        self.kinds: tuple[str, ...] = ()
        self.section: str | None = None
        self.section_line = 1
        self.seen_sections: set[str] = set()
        self.symptom: list[str] = []
        self.lists: dict[str, list[str]] = {name: [] for name in _LIST_SECTIONS}
        self.causes: list[Cause] = []
        # The cause being read: its heading and line, its **Field:** items, its free text.
        self.cause_head: tuple[str, int] | None = None
        self.cause_fields: dict[str, tuple[str, int]] = {}
        self.cause_text: list[str] = []

    def read_block(self, tokens: Sequence[Token], index: int, end: int) -> None:
        token = tokens[index]
        line = line_of(token)
        if token.type == "heading_open":
            self._heading(token.tag, tokens[index + 1].content.strip(), line)
        elif not self.title:
            raise RunbookError(line, "a runbook starts with a '# title' line")
        elif self.section is None:
            self._applies_to(tokens, index, end, line)
        elif self.section == "symptom":
            self.symptom.append(self._source_of(token))
        elif self.section in _LIST_SECTIONS:
            if token.type not in ("bullet_list_open", "ordered_list_open"):
                raise RunbookError(line, f"section {self.section!r} holds a list of steps")
            self.lists[self.section].extend(item for _, item in list_items(tokens, index, end))
        elif self.section == "likely causes":
            self._cause_block(tokens, index, end, line)

    def _source_of(self, token: Token) -> str:
        first, last = token.map or (0, 0)
        return "\n".join(self.source[first:last]).strip()

    def _heading(self, tag: str, heading: str, line: int) -> None:
        if tag == "h1":
            if self.title:
                raise RunbookError(line, "a runbook has one '# title'")
            self.title = heading
        elif tag == "h2":
            self._close_cause()
            section = heading.lower()
            if section not in SECTIONS:
                raise RunbookError(line, f"unknown section {heading!r}; sections are: {', '.join(SECTIONS)}")
            if section in self.seen_sections:
                raise RunbookError(line, f"section {heading!r} appears twice")
            self.seen_sections.add(section)
            self.section, self.section_line = section, line
        elif tag == "h3" and self.section == "likely causes":
            self._close_cause()
            self.cause_head = (heading, line)
        else:
            raise RunbookError(line, f"unexpected heading {heading!r} here")

    def _applies_to(self, tokens: Sequence[Token], index: int, end: int, line: int) -> None:
        """The one block allowed between the title and the first section: the event kinds."""
        if not _APPLIES.match("\n".join(inline_texts(tokens, index, end))):
            raise RunbookError(
                line, "before the first section, only '**Applies to:** `kind`, ...' is expected"
            )
        self.kinds = tuple(
            child.content
            for t in tokens[index:end]
            if t.type == "inline"
            for child in t.children or []
            if child.type == "code_inline"
        )
        if not self.kinds or any(not _KIND.fullmatch(kind) for kind in self.kinds):
            raise RunbookError(line, "'**Applies to:**' lists event kinds as `code`, e.g. `loss_spike`")

    def _cause_block(self, tokens: Sequence[Token], index: int, end: int, line: int) -> None:
        if self.cause_head is None:
            raise RunbookError(line, "under 'Likely causes', each cause starts with a '### heading'")
        if tokens[index].type != "bullet_list_open":
            self.cause_text.append(self._source_of(tokens[index]))
            return
        for item_line, item in list_items(tokens, index, end):
            match = _FIELD.match(item)
            if not match:
                raise RunbookError(item_line, "cause items are **Component:**, **Verify:** or **Mitigate:**")
            self.cause_fields[match.group(1)] = (match.group(2).strip(), item_line)

    def _close_cause(self) -> None:
        """The cause being read is complete (a heading or the end follows): check and keep it."""
        if self.cause_head is None:
            return
        name, line = self.cause_head
        fields = self.cause_fields
        for field in ("Component", "Verify", "Mitigate"):
            if not fields.get(field, ("", 0))[0]:
                raise RunbookError(line, f"cause {name!r} has no **{field}:** item")
        component, component_line = fields["Component"]
        if component.lower() not in COMPONENTS:
            allowed = ", ".join(COMPONENTS)
            problem = f"cause {name!r}: component {component!r} is not one of {allowed}"
            raise RunbookError(component_line, problem)
        explanation = "\n\n".join(self.cause_text)
        self.causes.append(
            Cause(name, component.lower(), fields["Verify"][0], fields["Mitigate"][0], explanation, line)
        )
        self.cause_head, self.cause_fields, self.cause_text = None, {}, []

    def finish(self, path: Path) -> Runbook:
        """The whole file was read: check that nothing required is missing."""
        self._close_cause()
        if not self.title:
            raise RunbookError(1, "empty runbook: it needs a '# title'")
        if not self.kinds:
            raise RunbookError(1, "no '**Applies to:** `kind`' line under the title")
        for name in SECTIONS:
            if name not in self.seen_sections:
                raise RunbookError(len(self.source), f"missing section '## {name.capitalize()}'")
        for name in _LIST_SECTIONS:
            if not self.lists[name]:
                raise RunbookError(self.section_line, f"section '{name}' has no steps")
        if not self.causes:
            raise RunbookError(self.section_line, "'Likely causes' has no '### cause'")
        return Runbook(
            name=path.stem,
            path=path,
            title=self.title,
            kinds=self.kinds,
            symptom="\n\n".join(self.symptom),
            first_checks=tuple(self.lists["first checks"]),
            causes=tuple(self.causes),
            escalation=tuple(self.lists["escalation"]),
            record=tuple(self.lists["what to record"]),
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
        ticked = latest.get(step.id)
        checked = bool(ticked is not None and (ticked.data or {}).get("checked"))
        states.append(
            StepState(step, checked, ticked.author if ticked else None, ticked.time if ticked else None)
        )
    return RunbookProgress(runbook, tuple(states))
