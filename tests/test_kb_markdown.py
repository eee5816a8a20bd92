"""Markdown export and import: every field, exact round trips, merges, and broken files."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from publisher.wire.protocol import make_message
from tuimon.kb import IncidentDraft, KnowledgeBase
from tuimon.kb.markdown import markdown_parser
from tuimon.kb.markdown_import import ParseError, parse_incident
from tuimon.kb.mdformat import SECTION_ORDER

AWKWARD_NOTE = """Checked the grad-norm chart | pipes | and `code | spans`.

## Not a heading of the export
```python
print("an unclosed fence")
> a quote inside a note
    indented code
<!-- html comment
Unicode: ∇L → NaN, 日本語, trailing backslash \\"""


def _event(step: int) -> dict:
    return make_message(
        "event",
        run="gpt-small",
        rank=1,
        host="node7",
        ts=1_700_000_000.5,
        seq=9,
        step=step,
        id=f"1-{step}",
        severity="critical",
        kind="nonfinite_loss",
        message="loss is nan",
        details={"loss": "nan"},
        count=2,
    )


@pytest.fixture
def source(tmp_path: Path) -> Iterator[KnowledgeBase]:
    with KnowledgeBase.open(tmp_path / "source", author="alice") as kb:
        first = kb.open_from_event(
            _event(500),
            run_start=make_message(
                "run_start",
                run="gpt-small",
                rank=1,
                host="node7",
                ts=1.0,
                seq=0,
                config={"lr": 6e-4},
                seed=7,
                argv=["train.py"],
                versions={"torch": "2.13.0"},
            ),
            metrics={
                "loss": (list(range(480, 520)), [math.nan if s == 500 else 2.0 for s in range(480, 520)]),
                "grad_norm": (list(range(480, 520)), [0.4] * 40),
            },
            gpu_devices=[
                {
                    "index": 0,
                    "name": "H100 | SXM",
                    "util": 12,
                    "mem_used": 2**33,
                    "mem_total": 2**36,
                    "throttle": ["hw_slowdown"],
                    "rank": 1,
                    "host": "node7",
                }
            ],
            tags=["fp16", "loss"],
            summary="Loss went NaN at step 500.\n\n- fp16\n- no clipping",
        )
        kb.add_note(first.number, AWKWARD_NOTE)
        kb.add_tried(first.number, "Switched to bf16 | autocast", "helped", step=510)
        kb.add_tried(first.number, "Lowered lr", "no_effect")
        kb.add_result(first.number, "no NaN in 2000 steps")
        kb.tick_step(first.number, "nonfinite_loss", "check-1")
        kb.tick_step(first.number, "nonfinite_loss", "cause-2-verify")
        kb.update(
            first.number,
            root_cause="fp16 overflow in attention logits",
            resolution="bf16",
            trigger="long sequences",
            detection="tuimon nonfinite_loss event",
        )
        kb.set_status(first.number, "resolved", note="stable since")
        kb.open_incident(IncidentDraft(title="Blank: nothing recorded yet / check *later*"))
        yield kb


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.md"))}


def test_round_trip_gives_identical_files(source: KnowledgeBase, tmp_path: Path) -> None:
    first_export = tmp_path / "export1"
    report = source.export(first_export)
    assert [p.name for p in report.written] == [
        "0001-nonfinite-loss-at-step-500-run-gpt-small.md",
        "0002-blank-nothing-recorded-yet-check-later.md",
    ]
    with KnowledgeBase.open(tmp_path / "empty", author="bob") as target:
        imported = target.import_files([first_export])
        assert imported.problems == []
        assert [outcome.created for _, outcome in imported.imported] == [True, True]
        target.export(tmp_path / "export2")
        assert _files(tmp_path / "export2") == _files(first_export)
        # The records themselves survived, not only their rendering.
        assert [e.to_json() for e in target.timeline(1)] == [e.to_json() for e in source.timeline(1)]
        assert [c.to_json() for c in target.context(1)] == [c.to_json() for c in source.context(1)]
        assert target.get(1) == source.get(1)
        assert target.timeline(1)[1].text == AWKWARD_NOTE
        assert target.search("autocast")[0].incident.number == 1


def test_export_contains_every_part_and_parses(source: KnowledgeBase, tmp_path: Path) -> None:
    source.export(tmp_path / "out")
    text = (tmp_path / "out" / "0001-nonfinite-loss-at-step-500-run-gpt-small.md").read_text()
    tokens = markdown_parser().parse(text)
    sections = [
        tokens[i + 1].content
        for i, t in enumerate(tokens)
        if t.type == "heading_open" and t.tag == "h2" and t.level == 0
    ]
    assert sections == list(SECTION_ORDER)
    for field in (
        "**Status:** resolved",
        "**Severity:** critical",
        "**Run:** gpt-small",
        "**Ranks:** 1",
        "**Steps:** 500",
        "**Kinds:** nonfinite_loss",
        "**Tags:** fp16, loss",
        "**Resolved by:** alice",
    ):
        assert f"- {field}\n" in text
    assert "| 2023-11-14T22:13:20.500Z |" not in text  # events are not "tried"
    assert "| Switched to bf16 \\| autocast | helped | 510 |" in text
    assert "- [x] `check-1` First checks · Stop or pause the run" in text
    assert "(`nonfinite_loss`: 2 of " in text
    assert "| **500** | nan | 0.4 |" in text  # the metrics window around the event step
    assert "| node7 | 1 | 0 | H100 \\| SXM | 12 | 8.0 / 64.0 |" in text
    assert '"git_commit"' not in text and '"seed": 7' in text


def test_import_twice_and_merge_newer_work(source: KnowledgeBase, tmp_path: Path) -> None:
    source.export(tmp_path / "a")
    with KnowledgeBase.open(tmp_path / "other", author="bob") as other:
        other.import_files([tmp_path / "a"])
        again = other.import_files([tmp_path / "a"])
        assert [(o.created, o.fields_updated, o.entries_added) for _, o in again.imported] == [
            (False, False, 0),
            (False, False, 0),
        ]
        entries_before = len(other.timeline(1))
        other.add_note(1, "bob's follow-up from another host")
        other.update(1, resolution="bf16 everywhere")
        other.export(tmp_path / "b")
    merged = source.import_files([tmp_path / "b"])
    assert merged.problems == []
    outcome = merged.imported[0][1]
    assert (outcome.created, outcome.fields_updated, outcome.entries_added) == (False, True, 1)
    assert len(source.timeline(1)) == entries_before + 1
    assert source.get(1).resolution == "bf16 everywhere"
    assert source.count() == 2


def test_number_taken_by_another_incident_gets_a_new_number(source: KnowledgeBase, tmp_path: Path) -> None:
    source.export(tmp_path / "a", [1])
    with KnowledgeBase.open(tmp_path / "busy", author="carol") as busy:
        busy.open_incident(IncidentDraft(title="carol's own #1"))
        [(_, outcome)] = busy.import_files([tmp_path / "a"]).imported
        assert outcome.number == 2
        assert busy.get(2).id == source.get(1).id
        assert busy.get(1).title == "carol's own #1"


def test_two_knowledge_bases_share_an_export_folder(tmp_path: Path) -> None:
    shared = tmp_path / "git-folder"
    for name in ("host-a", "host-b"):
        with KnowledgeBase.open(tmp_path / name, author=name) as kb:
            kb.open_incident(IncidentDraft(title="Same title"))
            kb.export(shared)
    names = {p.name for p in shared.glob("*.md")}
    assert len(names) == 2 and "0001-same-title.md" in names
    [suffixed] = names - {"0001-same-title.md"}
    assert suffixed.startswith("0001-same-title-") and len(suffixed) == len("0001-same-title-12345678.md")
    with KnowledgeBase.open(tmp_path / "host-c", author="c") as kb:
        assert len(kb.import_files([shared]).imported) == 2
        assert sorted(i.created_by for i in kb.list_incidents()) == ["host-a", "host-b"]


def test_renamed_incident_replaces_its_file(source: KnowledgeBase, tmp_path: Path) -> None:
    out = tmp_path / "out"
    source.export(out)
    source.update(2, title="Renamed")
    report = source.export(out)
    assert [p.name for p in report.written] == ["0002-renamed.md"]
    assert [p.name for p in report.removed] == ["0002-blank-nothing-recorded-yet-check-later.md"]
    assert [p.name for p in report.unchanged] == ["0001-nonfinite-loss-at-step-500-run-gpt-small.md"]
    assert sorted(p.name for p in out.iterdir()) == [
        "0001-nonfinite-loss-at-step-500-run-gpt-small.md",
        "0002-renamed.md",
    ]


def _break(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def _line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_broken_files_are_named_with_their_line_and_skipped(source: KnowledgeBase, tmp_path: Path) -> None:
    out = tmp_path / "out"
    source.export(out)
    good, other = sorted(out.glob("*.md"))
    text = good.read_text()
    cases = {
        "bad-status.md": (
            _break(text, "**Status:** resolved", "**Status:** fixed"),
            "**Status:** fixed",
            "unknown status 'fixed'",
        ),
        "bad-json.md": (_break(text, '"count": 2,', '"count": 2,,'), '"count": 2,,', "invalid JSON"),
        "bad-outcome.md": (
            _break(text, "**Outcome:** helped", "**Outcome:** great"),
            "**Outcome:** great",
            "unknown outcome 'great'",
        ),
        "bad-section.md": (_break(text, "## Detection", "## Detected"), "## Detected", "unknown section"),
        "bad-time.md": (
            _break(text, "### 2023-11-14T22:13:20.500Z", "### yesterday"),
            "### yesterday",
            "is not UTC ISO 8601",
        ),
    }
    broken = tmp_path / "broken"
    broken.mkdir()
    for name, (content, _, _) in cases.items():
        (broken / name).write_text(content)
    (broken / "zz-fine.md").write_text(other.read_text())
    with KnowledgeBase.open(tmp_path / "fresh", author="dan") as fresh:
        report = fresh.import_files([broken])
        problems = {problem.path.name: problem for problem in report.problems}
        assert sorted(problems) == sorted(cases)
        for name, (content, needle, message) in cases.items():
            assert problems[name].line == _line_of(content, needle), name
            assert message in problems[name].message, name
        assert [path.name for path, _ in report.imported] == ["zz-fine.md"]
        assert fresh.count() == 1
    with pytest.raises(ParseError, match="is this a tuimon export"):
        parse_incident("# Just some notes\n\nNothing else.\n")
