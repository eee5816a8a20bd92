"""The incident screen driven by Textual's Pilot over a real recording and a real SQLite knowledge
base: open an incident from the selected event, follow its runbook, write what was tried, search,
and two dashboards sharing one knowledge base live."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from helpers.keys import paste
from helpers.recordings import write_recording
from helpers.runs import synthetic_run
from helpers.screens import statics_text
from helpers.waiting import wait_for_screen
from textual.pilot import Pilot

from tuimon.kb import IncidentDraft, KnowledgeBase
from tuimon.sources.replay import ReplaySource
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.events import EventLog
from tuimon.ui.help import HelpScreen
from tuimon.ui.incidents.dialogs import PostmortemDialog, TriedDialog
from tuimon.ui.incidents.format import HIGHLIGHT_STYLE
from tuimon.ui.incidents.incident_list import IncidentList
from tuimon.ui.incidents.runbook_checklist import RunbookChecklist
from tuimon.ui.incidents.screen import EXPORT_DIR, IncidentScreen
from tuimon.ui.services.kb_link import KbLink

SIZE = (160, 48)
#: docs/incidents.md: "a note written in one tuimon appears in the others within two seconds".
SHARED_WITHIN_S = 2.0
LOSS_SPIKE_ROW, NONFINITE_ROW = 0, 1


@pytest.fixture
def kb_dir(tmp_path: Path) -> Path:
    return tmp_path / "team-kb"


@pytest.fixture
def kb(kb_dir: Path) -> Iterator[KnowledgeBase]:
    """The same knowledge base as the dashboards', opened the way another engineer's CLI would."""
    with KnowledgeBase.open(kb_dir, author="carol") as opened:
        yield opened


@asynccontextmanager
async def dashboard(
    recording: Path, kb_dir: Path, author: str = "alice", *, events: int = 2, size: tuple[int, int] = SIZE
) -> AsyncIterator[tuple[TuimonApp, Pilot]]:
    app = TuimonApp(ReplaySource([recording], speed=math.inf), kb_dir=str(kb_dir))
    app.kb_link = KbLink(kb_dir, author=author)  # as $TUIMON_AUTHOR would for another engineer
    async with app.run_test(size=size) as pilot:
        await wait_for_screen(pilot, lambda: "ENDED" in str(app.query_one("#header").visual), what="the end")
        assert app.query_one(EventLog).row_count == events
        yield app, pilot


def text(app: TuimonApp, selector: str) -> str:
    return str(app.screen.query_one(selector).visual)


def help_text(app: TuimonApp) -> str:
    """Everything the help screen on top lists (keys and what they do)."""
    return statics_text(app.screen)


def list_rows(app: TuimonApp) -> list[str]:
    return [
        str(option.prompt) for option in app.screen.query_one(IncidentList).options if not option.disabled
    ]


def highlighted_words(app: TuimonApp, row: int) -> list[str]:
    """The words shown highlighted in a search hit's snippet."""
    prompt = app.screen.query_one(IncidentList).options[row].prompt
    return [prompt.plain[span.start : span.end] for span in prompt.spans if span.style == HIGHLIGHT_STYLE]


def notifications(app: TuimonApp) -> list[str]:
    return [notification.message for notification in app._notifications]


async def open_screen(app: TuimonApp, pilot: Pilot, row: int = LOSS_SPIKE_ROW) -> IncidentScreen:
    """Select an event in the dashboard's log and press i; wait until the screen has read the kb."""
    app.query_one(EventLog).move_cursor(row=row)
    await pilot.press("i")
    await wait_for_screen(pilot, lambda: isinstance(app.screen, IncidentScreen), what="the incident screen")
    await wait_for_screen(
        pilot,
        lambda: any(s in text(app, "#kb-banner") for s in ("Not in any incident", "Recorded in")),
        what="what the knowledge base knows of the event",
    )
    return app.screen


async def open_incident(app: TuimonApp, pilot: Pilot) -> None:
    """n on the incident screen, and wait for the new incident's runbook to show."""
    before = len(list_rows(app))
    await pilot.press("n")
    await wait_for_screen(
        pilot, lambda: len(list_rows(app)) == before + 1, what="the new incident in the list"
    )
    await wait_for_screen(
        pilot, lambda: "Runbook: Loss spike" in str(checklist(app).border_title), what="runbook"
    )


def checklist(app: TuimonApp) -> RunbookChecklist:
    return app.screen.query_one(RunbookChecklist)


def step_lines(app: TuimonApp) -> list[str]:
    return [str(option.prompt) for option in checklist(app).options if not option.disabled]


async def test_an_incident_opens_from_the_selected_event_with_its_evidence(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        assert "loss_spike at step 120" in text(app, "#kb-banner")
        assert "Not in any incident yet" in text(app, "#kb-banner")
        await open_incident(app, pilot)
        assert "#1" in list_rows(app)[0] and "OPEN" in list_rows(app)[0]
        summary = text(app, "#kb-incident")
        assert "loss_spike at step 120" in summary and "run synthetic" in summary
        assert (
            "metrics steps 70-170" in summary and "GPU state (4 devices)" in summary and "seed 1" in summary
        )
        await wait_for_screen(
            pilot, lambda: "Recorded in #1" in text(app, "#kb-banner"), what="recorded in #1"
        )

        incident = kb.get(1)
        assert (incident.run, incident.host, incident.ranks) == ("synthetic", "testhost", (0,))
        assert (incident.kinds, incident.step_first, incident.severity) == (("loss_spike",), 120, "warning")
        assert incident.created_by == "alice"
        context = {record.kind: record.data for record in kb.context(1)}
        metrics = context["metrics"]
        assert metrics["steps"][0] == 70 and metrics["steps"][-1] == 170
        assert metrics["series"]["loss"][metrics["steps"].index(120)] == 50.0
        assert len(context["gpu"]["devices"]) == 4
        assert context["reproduction"]["seed"] == 1 and context["reproduction"]["config"]["lr"] == 0.01
        events = [entry for entry in kb.timeline(1) if entry.type == "event"]
        assert [entry.data["id"] for entry in events] == ["0-1"]

        # The same event again: pointed at #1 instead of a duplicate, unless n is pressed twice.
        await pilot.press("n")
        await wait_for_screen(
            pilot, lambda: any("already in #1" in n for n in notifications(app)), what="hint"
        )
        assert kb.count() == 1
        await pilot.press("n")
        await wait_for_screen(pilot, lambda: kb.count() == 2, what="a second incident on purpose")


async def test_one_key_press_on_the_dashboard_opens_an_incident_from_the_selected_event(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        app.query_one(EventLog).move_cursor(row=NONFINITE_ROW)
        await pilot.press("o")
        await wait_for_screen(pilot, lambda: kb.count() == 1, what="the incident opened by o")
        assert isinstance(app.screen, IncidentScreen)
        incident = kb.get(1)
        assert incident.kinds == ("nonfinite_loss",) and incident.created_by == "alice"
        assert {record.kind for record in kb.context(1)} >= {"metrics", "gpu", "reproduction"}
        await wait_for_screen(
            pilot, lambda: "Runbook:" in str(checklist(app).border_title), what="its runbook as a checklist"
        )


async def test_runbook_checklist_ticks_and_unticks_with_timeline_entries(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        assert all(line.startswith("☐") for line in step_lines(app))
        await pilot.press("enter")  # from the list into the checklist
        assert app.focused is checklist(app)
        await pilot.press("space")
        await wait_for_screen(pilot, lambda: step_lines(app)[0].startswith("☑"), what="the tick shown")
        await wait_for_screen(pilot, lambda: "ticked loss_spike/check-1" in text(app, "#kb-timeline-text"))
        ticks = [entry for entry in kb.timeline(1) if entry.type == "runbook_step"]
        assert [(t.author, t.data["step"], t.data["checked"]) for t in ticks] == [("alice", "check-1", True)]
        assert "(1/18 done)" in str(checklist(app).border_title)
        assert "alice" in step_lines(app)[0]

        await pilot.press("down", "enter")  # enter ticks too
        await wait_for_screen(pilot, lambda: step_lines(app)[1].startswith("☑"), what="the second tick")
        await pilot.press("up", "space")  # untick the first
        await wait_for_screen(pilot, lambda: step_lines(app)[0].startswith("☐"), what="untick shown")
        assert [step.step.id for step in kb.progress(1)[0].steps if step.checked] == ["check-2"]
        assert "unticked loss_spike/check-1" in text(app, "#kb-timeline-text")
        await pilot.press("escape")  # back to the list, then to the dashboard
        assert app.focused is app.screen.query_one(IncidentList)
        await pilot.press("escape")
        assert not isinstance(app.screen, IncidentScreen)


async def test_notes_tried_entries_and_results_from_the_keyboard(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        # Typed: the letters reach the field, not the incident screen's keys (a, n, r, t...).
        await pilot.press("a", *"grad-norm jumped from 0.3 to 900", "enter")
        await wait_for_screen(pilot, lambda: "note grad-norm jumped" in text(app, "#kb-timeline-text"))

        await pilot.press("t")
        assert isinstance(app.screen, TriedDialog)
        assert app.screen.query_one("#tried-step").value == "299"  # the run's step now: a default
        await paste(pilot, "raised Adam eps to 1e-6")
        await pilot.press("tab", "up", "tab")
        await paste(pilot, "130")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: "made it worse" in text(app, "#kb-timeline-text"))
        await pilot.press("t")
        await paste(pilot, "lowered the learning rate")
        await pilot.press("tab", "up", "up", "up", "enter")
        await wait_for_screen(pilot, lambda: "helped" in text(app, "#kb-timeline-text"))
        await pilot.press("r")
        await paste(pilot, "loss back to 2.1 after 300 steps")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: "result loss back" in text(app, "#kb-timeline-text"))

        entries = [(e.type, e.text, e.outcome, e.step, e.author) for e in kb.timeline(1) if e.type != "event"]
        assert entries == [
            ("note", "grad-norm jumped from 0.3 to 900", None, None, "alice"),
            ("tried", "raised Adam eps to 1e-6", "made_worse", 130, "alice"),
            ("tried", "lowered the learning rate", "helped", 299, "alice"),
            ("result", "loss back to 2.1 after 300 steps", None, None, "alice"),
        ]
        # An empty note is refused in the dialog, which stays open; escape loses nothing stored.
        await pilot.press("a", "enter")
        assert "type something first" in str(app.screen.query_one(".dialog-error").visual)
        await pilot.press("escape")
        assert isinstance(app.screen, IncidentScreen) and len(kb.timeline(1)) == 5


async def test_status_changes_and_the_list_filters_by_status(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    kb.open_incident(
        IncidentDraft(title="old throttling on node3", kinds=["gpu_throttle"], status="resolved")
    )
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        await pilot.press("s", "down", "tab")
        await paste(pilot, "looking at the data shard")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: "INVESTIGATING" in text(app, "#kb-incident"), what="new status")
        assert kb.get(2).status == "investigating"
        change = next(e for e in kb.timeline(2) if e.type == "status_change")
        assert (
            change.data == {"from": "open", "to": "investigating"}
            and change.text == "looking at the data shard"
        )

        await pilot.press("f", "down")  # "not resolved"
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: len(list_rows(app)) == 1, what="only the unresolved one")
        assert "#2" in list_rows(app)[0]
        assert "status open|investigating|mitigated" in str(
            app.screen.query_one(IncidentList).border_subtitle
        )
        await pilot.press("f", "end", "tab")  # resolved, then the kind
        await paste(pilot, "gpu_throttle")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: "#1" in "".join(list_rows(app)), what="the resolved one")
        assert len(list_rows(app)) == 1 and "throttling" in list_rows(app)[0]


async def test_search_handles_punctuation_and_phrases_with_highlighted_snippets(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    spike = kb.open_incident(IncidentDraft(title="Loss spike after warm-up", kinds=["loss_spike"]))
    kb.add_note(spike.number, "grad-norm jumped from 0.3 to 900 at the spike")
    other = kb.open_incident(IncidentDraft(title="Slow steps", kinds=["step_time_outlier"]))
    kb.add_note(other.number, "the loss was fine; a spike in step time came from the data loader")
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await pilot.press("slash")
        await paste(pilot, "grad-norm")
        await wait_for_screen(
            pilot, lambda: "Search: grad-norm (1 hit)" in str(app.screen.query_one(IncidentList).border_title)
        )
        assert (
            "Loss spike after warm-up" in list_rows(app)[0] and "note: grad-norm jumped" in list_rows(app)[0]
        )
        assert highlighted_words(app, 0) == ["grad-norm"]

        await pilot.press("escape")  # clears the search: the whole list again
        await wait_for_screen(pilot, lambda: len(list_rows(app)) == 2, what="the list back")
        await pilot.press("slash")
        await paste(pilot, '"loss spike"')
        await wait_for_screen(
            pilot, lambda: "(1 hit)" in str(app.screen.query_one(IncidentList).border_title)
        )
        assert "Loss spike after warm-up" in list_rows(app)[0]
        assert highlighted_words(app, 0) == ["Loss spike"]
        await pilot.press("enter")  # to the hits; the detail shows the incident found
        await wait_for_screen(pilot, lambda: "Loss spike after warm-up" in text(app, "#kb-incident"))

        await pilot.press("escape", "slash")
        await paste(pilot, "loss spike")  # both words anywhere: both incidents
        await wait_for_screen(
            pilot, lambda: "(2 hits)" in str(app.screen.query_one(IncidentList).border_title)
        )
        await pilot.press("escape", "slash")
        await paste(pilot, '"unbalanced')  # half-typed quotes are not an error
        await wait_for_screen(
            pilot, lambda: "(0 hits)" in str(app.screen.query_one(IncidentList).border_title)
        )


async def test_postmortem_fields_are_edited_and_searchable(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        await pilot.press("p", "tab")
        await paste(pilot, "lr, warmup")
        await pilot.press("tab", "tab", "tab", "tab")
        await paste(pilot, "warm-up too short for batch 4096")
        await pilot.press("ctrl+s")
        await wait_for_screen(pilot, lambda: "Root cause: warm-up too short" in text(app, "#kb-incident"))
        incident = kb.get(1)
        assert incident.root_cause == "warm-up too short for batch 4096" and incident.tags == ("lr", "warmup")
        assert incident.summary == ""  # untouched fields stay as they were
        await pilot.press("slash")
        await paste(pilot, "batch 4096")
        await wait_for_screen(pilot, lambda: "root cause: warm-up too short" in "".join(list_rows(app)))


async def test_seen_before_is_offered_with_what_helped_first(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    for title, status, tried, outcome in (
        ("spike at 40k", "resolved", "lowered the learning rate", "helped"),
        ("spike after resume", "resolved", "Lowered the learning rate.", "helped"),
        ("spike, still open", "investigating", "restarted from the last checkpoint", "no_effect"),
    ):
        past = kb.open_incident(IncidentDraft(title=title, kinds=["loss_spike"], status=status))
        kb.add_tried(past.number, tried, outcome)
    async with dashboard(recording, kb_dir) as (app, pilot):
        await wait_for_screen(
            pilot, lambda: any("seen before" in n for n in notifications(app)), what="offer"
        )
        offers = [n for n in notifications(app) if "seen before" in n]
        assert offers == [
            "loss_spike: seen before: 3 incidents, 2 resolved; helped: lowered the learning rate (2x). "
            "Press i to see them."
        ]  # and none for nonfinite_loss, never seen
        await open_screen(app, pilot)
        banner = text(app, "#kb-banner")
        assert "Seen before: 3 incidents, 2 resolved" in banner
        assert banner.index("helped: lowered the learning rate 2x") < banner.index(
            "no effect: restarted from the last checkpoint"
        )
        await pilot.press("escape")  # back on the dashboard, the same events are not offered again
        await pilot.pause(0.5)
        assert len([n for n in notifications(app) if "seen before" in n]) == 1


async def test_attach_another_event_and_export_to_markdown(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        await pilot.press("escape")
        await open_screen(app, pilot, row=NONFINITE_ROW)
        assert "nonfinite_loss at step 200" in text(app, "#kb-banner")
        await pilot.press("e")
        await wait_for_screen(
            pilot, lambda: "nonfinite_loss" in text(app, "#kb-incident"), what="kinds grown"
        )
        incident = kb.get(1)
        assert incident.kinds == ("loss_spike", "nonfinite_loss")
        assert (incident.step_first, incident.step_last) == (120, 200)
        await pilot.press("e")
        await wait_for_screen(pilot, lambda: any("already attached" in n for n in notifications(app)))

        await pilot.press("x")
        await wait_for_screen(
            pilot, lambda: any("exported to" in n for n in notifications(app)), what="export"
        )
        exported = sorted((kb_dir / EXPORT_DIR).glob("*.md"))
        assert len(exported) == 1 and str(exported[0]) in "".join(notifications(app))
        assert exported[0].read_text().startswith("# #1 loss_spike at step 120")


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
async def test_a_small_terminal_shows_the_list_then_the_incident_each_on_the_whole_width(
    recording: Path, kb_dir: Path, size: tuple[int, int]
) -> None:
    """The list (64 columns) and the incident side by side would leave the runbook and timeline
    a word a line: below 116 columns the screen shows one of them at a time, the whole width's."""
    width = size[0]
    shown = lambda: {w.id: w.region.width for w in app.screen.query("#kb-left, #kb-right") if w.region}  # noqa: E731
    async with dashboard(recording, kb_dir, size=size) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        assert shown() == {"kb-left": width}
        await pilot.press("enter")  # open the highlighted incident: its runbook has the focus
        assert app.focused is checklist(app) and shown() == {"kb-right": width}
        for pane in (checklist(app), app.screen.query_one("#kb-timeline")):
            assert pane.region.width == width
        assert "Runbook: Loss spike" in str(checklist(app).border_title) and step_lines(app)
        await pilot.press("escape")  # back to the list
        assert shown() == {"kb-left": width}
        await pilot.press("p")  # the longest dialog opens at its top: title, keys, first label
        await wait_for_screen(pilot, lambda: isinstance(app.screen, PostmortemDialog), what="the dialog")
        await pilot.pause(0.2)
        box = app.screen.query_one(".dialog-box").region
        for top in (".dialog-title", ".dialog-hint", "Label", "#pm-title"):
            assert box.contains_region(app.screen.query(top).first().region), top
        await pilot.press("escape")
        await pilot.resize_terminal(160, 48)  # wide enough: side by side again
        await pilot.pause(0.2)
        assert shown() == {"kb-left": 64, "kb-right": 96}


async def test_help_lists_the_incident_keys(recording: Path, kb_dir: Path) -> None:
    async with dashboard(recording, kb_dir) as (app, pilot):
        await pilot.press("question_mark")
        assert "Incident screen (i)" in help_text(app)
        await pilot.press("escape")
        screen = await open_screen(app, pilot)
        shown = [b.binding for b in screen.active_bindings.values() if b.binding.show]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        listed = help_text(app)
        for binding in shown:
            assert app.get_key_display(binding) in listed
        assert "Record something tried" in listed and "Tick or untick" in listed
        # Dashboard keys do nothing under the incident screen (l would change an unseen chart).
        assert {"l", "g", "c", "space", "plus"}.isdisjoint(b.key for b in shown)


async def test_a_knowledge_base_that_cannot_open_is_explained(recording: Path, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    async with dashboard(recording, not_a_folder) as (app, pilot):
        app.query_one(EventLog).move_cursor(row=0)
        await pilot.press("i")
        await wait_for_screen(pilot, lambda: "cannot open the knowledge base" in text(app, "#kb-banner"))
        await pilot.press("a", "n")
        assert isinstance(app.screen, IncidentScreen) and app.is_running


async def test_two_dashboards_on_one_knowledge_base_see_each_others_notes_live(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    async with (
        dashboard(recording, kb_dir, "alice") as (alice, alice_pilot),
        dashboard(recording, kb_dir, "bob") as (bob, bob_pilot),
    ):
        await open_screen(alice, alice_pilot)
        await open_screen(bob, bob_pilot)
        await open_incident(alice, alice_pilot)
        # Bob pressed nothing: the incident and the event's "recorded in" reach his screen.
        await wait_for_screen(bob_pilot, lambda: len(list_rows(bob)) == 1, SHARED_WITHIN_S, "bob's list")
        await wait_for_screen(bob_pilot, lambda: "Recorded in #1" in text(bob, "#kb-banner"), SHARED_WITHIN_S)

        await alice_pilot.press("a")
        await paste(alice_pilot, "alice: grad-norm was flat, suspect the batch")
        pressed = time.monotonic()
        await alice_pilot.press("enter")
        await wait_for_screen(
            bob_pilot,
            lambda: "grad-norm was flat" in text(bob, "#kb-timeline-text"),
            SHARED_WITHIN_S,
            "alice's note on bob's screen",
        )
        print(f"alice's note on bob's screen after {time.monotonic() - pressed:.2f} s")

        await bob_pilot.press("t")
        await paste(bob_pilot, "skipped the batch")
        await bob_pilot.press("tab", "up", "up", "up", "enter")
        await wait_for_screen(
            alice_pilot,
            lambda: "skipped the batch" in text(alice, "#kb-timeline-text"),
            SHARED_WITHIN_S,
            "bob's tried entry on alice's screen",
        )
        await bob_pilot.press("enter", "space")  # bob ticks the first step of the runbook
        await wait_for_screen(
            alice_pilot,
            lambda: "bob" in step_lines(alice)[0],
            SHARED_WITHIN_S,
            "bob's tick on alice's screen",
        )
        authors = {(e.type, e.author) for e in kb.timeline(1)}
        assert {("note", "alice"), ("tried", "bob"), ("runbook_step", "bob")} <= authors


async def test_blank_incidents_when_no_event_is_selected(
    tmp_path: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    quiet = [message for message in synthetic_run() if message["type"] != "event"]
    async with dashboard(write_recording(tmp_path / "quiet.jsonl", quiet), kb_dir, events=0) as (app, pilot):
        await pilot.press("i")
        await wait_for_screen(
            pilot, lambda: isinstance(app.screen, IncidentScreen), what="the incident screen"
        )
        await wait_for_screen(
            pilot, lambda: "no incidents yet" in str(app.screen.query_one(IncidentList).options[0].prompt)
        )
        assert "No event selected" in text(app, "#kb-banner")
        await pilot.press("n")
        await paste(pilot, "NCCL timeouts on node7")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: len(list_rows(app)) == 1, what="the blank incident")
        await pilot.press("N")
        await paste(pilot, "second one")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: len(list_rows(app)) == 2, what="another blank incident")
        assert [i.title for i in kb.list_incidents()] == ["second one", "NCCL timeouts on node7"]
        assert kb.get(1).kinds == () and kb.timeline(1) == [] and kb.context(1) == []
        assert "no runbook matches" in step_lines_all(app)[0]
        await pilot.press("e")  # no event to attach: the key is offered dimmed and does nothing
        await pilot.pause(0.6)
        assert kb.timeline(2) == [] and not any("attach" in n for n in notifications(app))


def step_lines_all(app: TuimonApp) -> list[str]:
    return [str(option.prompt) for option in checklist(app).options]


async def test_the_screen_stays_usable_while_another_writer_holds_the_lock(
    recording: Path, kb_dir: Path, kb: KnowledgeBase
) -> None:
    """Another engineer's long write: the note waits for it (and is not lost), reading goes on."""
    async with dashboard(recording, kb_dir) as (app, pilot):
        await open_screen(app, pilot)
        await open_incident(app, pilot)
        blocker = sqlite3.connect(kb.location.db_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # holds the write lock
        try:
            await pilot.press("a")
            await paste(pilot, "written while locked")
            await pilot.press("enter", "slash")
            await paste(pilot, "spiking")
            await wait_for_screen(
                pilot, lambda: "(1 hit)" in str(app.screen.query_one(IncidentList).border_title)
            )
            await pilot.pause(0.5)
            assert "written while locked" not in text(app, "#kb-timeline-text")
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        await wait_for_screen(pilot, lambda: "written while locked" in text(app, "#kb-timeline-text"))
        assert [e.text for e in kb.timeline(1) if e.type == "note"] == ["written while locked"]
