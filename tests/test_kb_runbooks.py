"""Runbooks: one per event kind, every shipped file parses with markdown-it-py, broken files are
named with their line and skipped, team runbooks extend and override the shipped ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from publisher.wire.event_kinds import EVENT_KINDS
from tuimon.kb import IncidentDraft, KnowledgeBase
from tuimon.kb.markdown import markdown_parser
from tuimon.kb.runbooks import COMPONENTS, RunbookError, load_runbooks, parse_runbook, shipped_runbooks_dir

SHIPPED = shipped_runbooks_dir()

GOOD = """# Custom hang

**Applies to:** `nccl_hang`

## Symptom

Steps stop; every rank waits in a collective.

## First checks

1. Dump the stacks with `py-spy dump --pid PID`.

## Likely causes

### A rank died

- **Component:** infrastructure
- **Verify:** One rank's process is gone.
- **Mitigate:** Restart from the last checkpoint.

## Escalation

- Cluster on-call.

## What to record

- Which rank and why.
"""


def test_every_event_kind_has_a_runbook_and_every_runbook_kind_exists() -> None:
    library = load_runbooks([SHIPPED])
    assert library.problems == ()
    assert library.kinds() == set(EVENT_KINDS)
    for kind in EVENT_KINDS:
        assert [book.name for book in library.for_kinds([kind])] == [kind]


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.md")), ids=lambda p: p.stem)
def test_shipped_runbook_is_complete(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    tokens = markdown_parser().parse(text)
    assert [t.tag for t in tokens if t.type == "heading_open"][:2] == ["h1", "h2"]
    book = parse_runbook(text, path)
    assert book.kinds == (path.stem,)
    assert len(book.symptom) > 150, "the symptom section says how to recognise it"
    assert len(book.first_checks) >= 3
    assert len(book.causes) >= 3
    assert {cause.component for cause in book.causes} <= set(COMPONENTS)
    for cause in book.causes:
        assert len(cause.verify) > 40 and len(cause.mitigate) > 30, cause.title
    assert book.escalation and book.record
    ids = [step.id for step in book.steps()]
    assert len(ids) == len(set(ids))
    assert ids[0] == "check-1" and "cause-1-verify" in ids and ids[-1].startswith("record-")


def test_every_shipped_runbook_step_reads_as_rendered_markdown_in_the_app() -> None:
    """The checklist shows ``**before**`` in bold, `code` in the accent, and no Markdown syntax."""
    from tuimon.ui.incidents.format import inline_markdown

    steps = [step for book in load_runbooks([SHIPPED]).runbooks.values() for step in book.steps()]
    emphasised = 0
    for step in steps:
        shown = inline_markdown(step.text)
        prose = list(shown.plain)  # the text outside code spans, where Markdown syntax would show
        for span in shown.spans:
            if span.style == "$accent":
                prose[span.start:span.end] = " " * (span.end - span.start)
        assert "**" not in "".join(prose) and "`" not in shown.plain, (step.id, shown.plain)
        emphasised += any(span.style == "bold" for span in shown.spans)
    assert emphasised >= 3, "nonfinite_loss, nonfinite_param and grad_explosion stress a word"
    before = inline_markdown("keep the checkpoint written **before** the `nonfinite_loss` step")
    assert before.plain == "keep the checkpoint written before the nonfinite_loss step"
    assert [(before.plain[span.start:span.end], span.style) for span in before.spans] == [
        ("before", "bold"), ("nonfinite_loss", "$accent")]


@pytest.mark.parametrize(
    ("broken", "line", "message"),
    [
        (GOOD.replace("**Applies to:** `nccl_hang`", "Applies to nccl_hang"), 3, "Applies to"),
        (GOOD.replace("## Escalation", "## Escalate"), 21, "unknown section 'Escalate'"),
        (
            GOOD.replace("- **Verify:** One rank's process is gone.\n", ""),
            15,
            re.escape("has no **Verify:**"),
        ),
        (
            GOOD.replace("**Component:** infrastructure", "**Component:** network"),
            17,
            "'network' is not one of",
        ),
        (GOOD.replace("- **Mitigate:**", "- **Fix:**"), 19, "cause items are"),
        (
            GOOD.replace("1. Dump the stacks with `py-spy dump --pid PID`.", "Dump the stacks."),
            11,
            "list of steps",
        ),
        (GOOD.replace("## What to record\n\n- Which rank and why.\n", ""), 25, "missing section"),
        ("", 1, "empty runbook"),
    ],
)
def test_broken_runbook_names_its_line(broken: str, line: int, message: str) -> None:
    with pytest.raises(RunbookError, match=message) as caught:
        parse_runbook(broken, Path("x.md"))
    assert caught.value.line == line


def test_broken_team_runbook_is_skipped_and_the_rest_still_load(tmp_path: Path) -> None:
    team = tmp_path / "kb" / "runbooks"
    team.mkdir(parents=True)
    (team / "nccl_hang.md").write_text(GOOD)
    (team / "bad.md").write_text(GOOD.replace("## Symptom", "## Symptoms"))
    (team / "loss_spike.md").write_text(
        GOOD.replace("`nccl_hang`", "`loss_spike`").replace("Custom hang", "Ours")
    )
    (team / "README.md").write_text("# not a runbook\n")
    with KnowledgeBase.open(tmp_path / "kb", author="alice") as kb:
        library = kb.runbooks
        [problem] = library.problems
        assert problem.path == team / "bad.md" and problem.line == 5
        assert str(problem).startswith(f"{team / 'bad.md'}:5: unknown section 'Symptoms'")
        assert len(library.runbooks) == len(EVENT_KINDS) + 1  # shipped + nccl_hang; loss_spike replaced
        assert library.runbooks["loss_spike"].title == "Ours"
        incident = kb.open_incident(IncidentDraft(title="hang", kinds=["nccl_hang"]))
        [state] = kb.progress(incident.number)
        assert [s.step.id for s in state.steps] == [
            "check-1",
            "cause-1-verify",
            "cause-1-mitigate",
            "escalate-1",
            "record-1",
        ]


def test_the_readme_table_of_what_it_catches_names_every_event_kind() -> None:
    """A new detector or invariant lands with its row in the README (and its runbook, above)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("### What it catches", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {kind for row in rows for kind in row.split("|")[1].replace("`", "").replace(",", " ").split()}
    assert set(EVENT_KINDS) <= named, sorted(set(EVENT_KINDS) - named)
