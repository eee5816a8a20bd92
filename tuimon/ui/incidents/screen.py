"""The incident screen (``i`` on the dashboard): the knowledge base next to the selected event.

Left, the incidents (filtered with ``f``) or the hits of a full-text search (``/``); right, the
highlighted incident: its fields, the matching runbook as a checklist (space ticks a step, which
writes a timeline entry) and its timeline. On top, the event selected on the dashboard with what
the knowledge base has seen of its kind before, what helped first, and whether it is already
recorded. ``n`` opens an incident from that event with its evidence (metrics window, GPU state,
reproduction record); ``a``/``t``/``r``/``s`` add a note, something tried with its outcome, a
result, a status change.

On a terminal narrower than the list and a readable incident side by side (80 or 100 columns),
the screen is compact like the dashboard (:mod:`tuimon.ui.compact`): one side at a time, the
whole width's, the one that has the focus (enter on the list opens the incident, escape goes
back to the list). The banner goes with the list: the incident then has every row.

Every SQLite call runs in a thread worker (reads on the link's reader, writes queued on its
writer); the screen only draws what the workers post back. Another engineer's note shows up
here without any key press: the link polls the database's change counter twice a second and the
screen reloads what it shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from textual import events, on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import OptionDoesNotExist
from textual.worker import Worker, WorkerState, get_current_worker

from tuimon.errors import UserError
from tuimon.kb import ContextRecord, Entry, Incident, IncidentDraft, IncidentFilter, KnowledgeBase, SeenBefore
from tuimon.kb.capture import DEFAULT_WINDOW
from tuimon.kb.incidents import NO_FILTER
from tuimon.kb.runbooks import RunbookProgress
from tuimon.store import EventRecord
from tuimon.ui.compact import mark_compact
from tuimon.ui.context import EventContext
from tuimon.ui.footer import FittedFooter
from tuimon.ui.format import severity
from tuimon.ui.help import HelpScreen
from tuimon.ui.incidents.dialogs import (
    DIALOG_KEYS,
    FilterDialog,
    PostmortemDialog,
    StatusDialog,
    TextDialog,
    TriedDialog,
    TriedInput,
)
from tuimon.ui.incidents.format import (
    incident_summary,
    seen_before_content,
    status_label,
    timeline_content,
)
from tuimon.ui.incidents.incident_list import IncidentList
from tuimon.ui.incidents.runbook_checklist import RunbookChecklist
from tuimon.ui.services.kb_link import KbLink, KbWritten, KnowledgeBaseChanged, error_text

#: Incidents listed (most recently active first) and search hits shown.
LIST_LIMIT = 200
SEARCH_LIMIT = 50
#: Folder of the knowledge base that ``x`` exports into (one Markdown file per incident).
EXPORT_DIR = "exports"
#: Seconds during which a second ``n`` opens another incident for an event already recorded.
CONFIRM_NEW_S = 5.0
#: The smallest terminal (columns, rows) that shows the list and the incident side by side: the
#: list's 64 columns and 52 to read the incident, its runbook and timeline in; any height.
WIDE_LAYOUT = (116, 0)
#: Actions that work on the highlighted incident.
_ON_INCIDENT = frozenset({"note", "result", "tried", "status", "postmortem", "export", "attach"})
_DIM = "$foreground 60%"


@dataclass(frozen=True)
class IncidentDetail:
    """Everything the right-hand side shows of one incident, read in one worker."""

    incident: Incident
    entries: tuple[Entry, ...]
    progress: tuple[RunbookProgress, ...]
    records: tuple[ContextRecord, ...]


@dataclass(frozen=True)
class EventKnowledge:
    """What the knowledge base knows about the dashboard's selected event."""

    seen: SeenBefore
    recorded_in: tuple[Incident, ...]


class IncidentScreen(Screen[None]):
    """The knowledge base for ``context`` (the dashboard's selected event, or None)."""

    DEFAULT_CSS = """
    IncidentScreen #kb-banner {
        height: auto;
        max-height: 6;
        background: $panel;
        padding: 0 1;
    }
    IncidentScreen #kb-left {
        width: 64;
    }
    IncidentScreen #kb-search {
        margin: 0;
    }
    IncidentScreen #kb-incident {
        height: auto;
        max-height: 14;
        border: round $primary 50%;
        padding: 0 1;
    }
    IncidentScreen #kb-timeline {
        height: 1fr;
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        padding: 0 1;
    }
    IncidentScreen #kb-timeline:focus {
        border: round $accent;
    }
    IncidentScreen.-compact #kb-left {
        width: 1fr;
    }
    IncidentScreen.-compact #kb-right, IncidentScreen.-compact.-reading #kb-left,
    IncidentScreen.-compact.-reading #kb-banner {
        display: none;
    }
    IncidentScreen.-compact.-reading #kb-right {
        display: block;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", tooltip="Back to the list, then to the dashboard"),
        Binding(
            "n", "new_incident", "New", tooltip="Open an incident from the selected event (blank if none)"
        ),
        Binding(
            "N", "new_blank", "Blank", key_display="N", tooltip="Open a blank incident (asks for a title)"
        ),
        Binding("a", "note", "Note", tooltip="Add a note to the highlighted incident's timeline"),
        Binding("t", "tried", "Tried", tooltip="Record something tried and its outcome (and step)"),
        Binding("r", "result", "Result", tooltip="Record a result: what was observed"),
        Binding(
            "s", "status", "Status", tooltip="Change the status: open, investigating, mitigated, resolved"
        ),
        Binding("e", "attach", "Attach", tooltip="Attach the dashboard's selected event to the incident"),
        Binding("p", "postmortem", "Postmortem", tooltip="Edit title, tags, summary, root cause, resolution"),
        Binding(
            "slash",
            "search",
            "Search",
            key_display="/",
            tooltip='Full-text search: words, "phrases", thrott*',
        ),
        Binding("f", "filter", "Filter", tooltip="Filter by status, kind, tag, run, date"),
        Binding(
            "x", "export", "Export", tooltip="Export the incident to Markdown (the kb's exports/ folder)"
        ),
        Binding("question_mark", "help", "Help", key_display="?", tooltip="This list of keys"),
    ]

    class ListLoaded(Message):
        """The incidents (or search hits) for ``query`` and ``where``, or why there are none."""

        def __init__(
            self, query: str, where: IncidentFilter, items: tuple[Any, ...], total: int, error: str | None
        ) -> None:
            super().__init__()
            self.query, self.where, self.items, self.total, self.error = query, where, items, total, error

    class DetailLoaded(Message):
        """Everything shown of one incident."""

        def __init__(self, detail: IncidentDetail) -> None:
            super().__init__()
            self.detail = detail

    class EventLoaded(Message):
        """What the knowledge base knows of the selected event."""

        def __init__(self, knowledge: EventKnowledge | None, error: str | None) -> None:
            super().__init__()
            self.knowledge = knowledge
            self.error = error

    def __init__(self, link: KbLink, context: EventContext | None, *, open_incident: bool = False) -> None:
        """``link``: the app's knowledge base link (threads, change polling); ``open_incident``:
        open a new incident from ``context`` as soon as the screen shows (the dashboard's one-key
        path from an event to an incident)."""
        super().__init__()
        self.link = link
        self.context = context
        self._open_on_mount = open_incident
        self.where: IncidentFilter = NO_FILTER
        self.search_text = ""
        self._keep: int | None = None
        self._detail: IncidentDetail | None = None
        self._knowledge: EventKnowledge | None = None
        self._knowledge_error: str | None = None
        self._confirm_new_until = 0.0

    # ------------------------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static(id="kb-banner")
        with Horizontal(id="kb-main"):
            with Vertical(id="kb-left"):
                yield Input(placeholder='/ search: words, "a phrase", prefix*, OR, NOT', id="kb-search")
                yield IncidentList(id="kb-list")
            with Vertical(id="kb-right"):
                yield Static(id="kb-incident")
                yield RunbookChecklist(id="kb-runbook")
                with VerticalScroll(id="kb-timeline"):
                    yield Static(id="kb-timeline-text")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.query_one("#kb-timeline").border_title = "Timeline"
        self.query_one(IncidentList).border_title = "Incidents"
        self._show_detail(None)
        self._draw_banner()
        self.link.subscribe(self)
        self.query_one(IncidentList).focus()
        self.reload()
        if self._open_on_mount:
            self.action_new_incident()

    def on_unmount(self) -> None:
        self.link.unsubscribe(self)

    # ---------------------------------------------------------------------- small terminals

    def on_resize(self, event: events.Resize) -> None:
        mark_compact(self, event.size, WIDE_LAYOUT)

    def on_screen_resume(self) -> None:
        mark_compact(self, self.app.size, WIDE_LAYOUT)  # the terminal may have changed under a dialog

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """Note which side has the focus: the compact layout shows that one (the list, or the
        incident once enter or tab went there)."""
        self.set_class(self.query_one("#kb-right") in event.widget.ancestors, "-reading")

    # ----------------------------------------------------------------------------------- loading

    def reload(self) -> None:
        """Read again everything shown (after any change to the knowledge base); the highlighted
        incident is read again once the list is (it may have left the list)."""
        self._load_list(self.search_text, self.where)
        if self.context is not None:
            self._load_event()

    def on_knowledge_base_changed(self, message: KnowledgeBaseChanged) -> None:
        self.reload()

    @work(thread=True, exclusive=True, group="kb-list", exit_on_error=False)
    def _load_list(self, query: str, where: IncidentFilter) -> None:
        worker = get_current_worker()
        items: tuple[Any, ...] = ()
        total, error = 0, None
        try:
            kb = self.link.reader()
            if query:
                items = tuple(kb.search(query, where=where, limit=SEARCH_LIMIT))
                total = len(items)
            else:
                items = tuple(kb.list_incidents(where, limit=LIST_LIMIT))
                total = kb.count(where)
        except UserError as exc:
            error = str(exc)
        if not worker.is_cancelled:
            self.post_message(self.ListLoaded(query, where, items, total, error))

    @work(thread=True, exclusive=True, group="kb-detail", exit_on_error=False)
    def _load_detail(self, number: int) -> None:
        worker = get_current_worker()
        try:
            kb = self.link.reader()
            detail = IncidentDetail(
                kb.get(number),
                tuple(kb.timeline(number)),
                tuple(kb.progress(number)),
                tuple(kb.context(number)),
            )
        except UserError:
            return  # no knowledge base (the banner says why), or the incident is gone (the list too)
        if not worker.is_cancelled:
            self.post_message(self.DetailLoaded(detail))

    @work(thread=True, exclusive=True, group="kb-event", exit_on_error=False)
    def _load_event(self) -> None:
        context = self.context
        assert context is not None
        worker = get_current_worker()
        try:
            recorded_in = tuple(self.link.incidents_with_event(context.run, context.event))
            exclude = recorded_in[0].number if recorded_in else None
            seen = self.link.seen_before(context.event.kind, exclude=exclude)
            knowledge = EventKnowledge(seen, recorded_in)
            message = self.EventLoaded(knowledge, None)
        except UserError as exc:
            message = self.EventLoaded(None, str(exc))
        if not worker.is_cancelled:
            self.post_message(message)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Unexpected failures of any worker of this screen, reported once, here."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self.notify(
                error_text(event.worker.error), title="Knowledge base", severity="error", markup=False
            )

    # ---------------------------------------------------------------------------------- drawing

    def on_incident_screen_list_loaded(self, message: ListLoaded) -> None:
        if message.query != self.search_text or message.where != self.where:
            return  # an older request's answer
        listing = self.query_one(IncidentList)
        keep, self._keep = self._keep, None
        if message.query:
            listing.empty_text = "no matches"
            listing.show_hits(message.items, keep)
            noun = "hit" if message.total == 1 else "hits"
            listing.border_title = f"Search: {message.query} ({message.total} {noun})"
        else:
            listing.empty_text = "no incident matches the filter" if self.where.active else "no incidents yet"
            listing.show_incidents(message.items, keep)
            shown = (
                f"{len(message.items)} of {message.total}"
                if message.total > len(message.items)
                else message.total
            )
            listing.border_title = f"Incidents ({shown})"
        listing.border_subtitle = self._filter_text()
        if message.error:
            listing.border_subtitle = message.error
            if self.link.error:
                self._draw_banner()
        number = listing.selected_number
        if number is None:
            self._show_detail(None)
        else:
            self._load_detail(number)
        self.refresh_bindings()

    def on_incident_screen_detail_loaded(self, message: DetailLoaded) -> None:
        if message.detail.incident.number == self.selected_number():
            self._show_detail(message.detail)

    def on_incident_screen_event_loaded(self, message: EventLoaded) -> None:
        self._knowledge, self._knowledge_error = message.knowledge, message.error
        self._draw_banner()

    def _show_detail(self, detail: IncidentDetail | None) -> None:
        if detail is not None and detail == self._detail:
            return
        old, self._detail = self._detail, detail
        summary = self.query_one("#kb-incident", Static)
        checklist = self.query_one(RunbookChecklist)
        timeline = self.query_one("#kb-timeline", VerticalScroll)
        if detail is None:
            summary.update(Content.styled("no incident selected: n opens one", _DIM))
            checklist.show([], empty="the runbook of the incident's kinds shows here, as a checklist")
            self.query_one("#kb-timeline-text", Static).update("")
            return
        summary.update(incident_summary(detail.incident, detail.records))
        if old is None or old.progress != detail.progress:
            checklist.show(detail.progress)
        if old is None or old.entries != detail.entries:
            same_incident = old is not None and old.incident.number == detail.incident.number
            following = not same_incident or timeline.scroll_y >= timeline.max_scroll_y
            self.query_one("#kb-timeline-text", Static).update(timeline_content(detail.entries))
            timeline.border_title = f"Timeline ({len(detail.entries)})"
            if following:
                self.call_after_refresh(timeline.scroll_end, animate=False)

    def _draw_banner(self) -> None:
        """Where the knowledge base is; the selected event and what the knowledge base knows of it."""
        link = self.link
        where = (
            f"{link.location.path} (chosen by {link.location.source})"
            if link.location is not None
            else "opening…"
        )
        lines = [Content.assemble(("Incident knowledge base ", "bold $primary"), (where, _DIM))]
        if link.error:
            lines.append(Content.styled(link.error, "bold $error"))
        if self.context is None:
            lines.append(
                Content.styled(
                    "No event selected on the dashboard (pick one in its event log: e, the arrows, then "
                    "o opens an incident from it): n opens a blank incident",
                    _DIM,
                )
            )
        else:
            lines += self._event_lines(self.context)
        self.query_one("#kb-banner", Static).update(Content("\n").join(lines))

    def _event_lines(self, context: EventContext) -> list[Content]:
        """The selected event, whether its kind was seen before and what helped, where it is recorded."""
        event = context.event
        at = f" at step {event.step:,}" if event.step is not None else ""
        lines = [
            Content.assemble(
                ("Selected event: ", "bold"),
                severity(event.severity),
                (f" {event.kind}{at}", "bold"),
                (f" · run {context.run} · ", _DIM),
                event.message,
            )
        ]
        knowledge = self._knowledge
        if self._knowledge_error:
            lines.append(Content.styled(self._knowledge_error, "$error"))
        elif knowledge is not None:
            lines.append(seen_before_content(knowledge.seen, recorded=bool(knowledge.recorded_in)))
            if knowledge.recorded_in:
                first = knowledge.recorded_in[0]
                lines.append(
                    Content.assemble(
                        ("Recorded in ", "bold"),
                        (", ".join(i.ref for i in knowledge.recorded_in), "bold $primary"),
                        " (",
                        status_label(first.status),
                        "): a adds a note, t something tried",
                    )
                )
            else:
                lines.append(
                    Content.assemble(("Not in any incident yet: ", "bold $warning"), "n opens one from it")
                )
        return lines

    def _filter_text(self) -> str:
        where = self.where
        parts = [
            *(["status " + "|".join(where.statuses)] if where.statuses else []),
            *(["kind " + "|".join(where.kinds)] if where.kinds else []),
            *(["tag " + "|".join(where.tags)] if where.tags else []),
            *([f"run {where.run}"] if where.run else []),
            *([f"since {where.since[:16]}"] if where.since else []),
            *([f"until {where.until[:16]}"] if where.until else []),
        ]
        return ("filter: " + ", ".join(parts)) if parts else "f: filter"

    # ------------------------------------------------------------------------------ navigation

    def selected_number(self) -> int | None:
        return self.query_one(IncidentList).selected_number

    @on(OptionList.OptionHighlighted, "#kb-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        number = self.selected_number()
        if number is not None and (self._detail is None or self._detail.incident.number != number):
            self._load_detail(number)
        self.refresh_bindings()

    @on(OptionList.OptionSelected, "#kb-list")
    def _open_detail(self, event: OptionList.OptionSelected) -> None:
        self.query_one(RunbookChecklist).focus()

    @on(Input.Changed, "#kb-search")
    def _search_changed(self, event: Input.Changed) -> None:
        self.search_text = event.value.strip()
        self._load_list(self.search_text, self.where)

    @on(Input.Submitted, "#kb-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        self.query_one(IncidentList).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in _ON_INCIDENT:
            return True
        if not self.is_mounted:
            return None  # asked while the screen is still being built (a resize refreshes keys)
        nothing = self.selected_number() is None or (action == "attach" and self.context is None)
        return None if nothing else True  # shown, dimmed: there is nothing to act on yet

    def action_back(self) -> None:
        search = self.query_one("#kb-search", Input)
        listing = self.query_one(IncidentList)
        if self.focused is not None and self.focused not in (search, listing):
            listing.focus()
        elif search.value:
            search.value = ""
            listing.focus()
        else:
            self.dismiss()

    def action_search(self) -> None:
        self.query_one("#kb-search", Input).focus()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(key_sections(self.app)))

    # -------------------------------------------------------------------------------- writing

    def _submit(self, what: str, work: Callable[[KnowledgeBase], Any]) -> None:
        self.link.submit(what, work, self)

    def on_kb_written(self, message: KbWritten) -> None:
        if message.error:
            self.notify(message.error, title="Knowledge base", severity="error", markup=False)
        else:
            self._confirm(message.what, message.result)
        self.reload()

    def _confirm(self, what: str, result: Any) -> None:
        """Tell the user what happened (a tick is visible in the checklist already)."""
        if what == "open":
            self._keep = result.number
            self.notify(f"opened {result.ref}: {result.title}", timeout=4, markup=False)
        elif what == "status" and result is None:
            self.notify("the incident already had that status", timeout=3)
        elif what == "attach":
            self.notify("attached the event" if result else "that event was already attached", timeout=3)
        elif what == "export":
            path = (result.written or result.unchanged)[0]
            self.notify(f"exported to {path}", title="Markdown export", timeout=10, markup=False)
        elif what in ("note", "result", "tried", "status", "edit"):
            self.notify(f"{what} saved", timeout=2)

    def _capture(self) -> dict[str, Any]:
        """The evidence around the selected event, read from the store now (more steps after the
        event may have arrived since the screen opened): run, host, run_start, metrics, GPUs."""
        context = self.context
        assert context is not None
        store = context.store
        view = store.run_view(context.run) or context.run_view
        step = context.event.step
        window = (
            store.metric_window(context.run, step, before=DEFAULT_WINDOW, after=DEFAULT_WINDOW)
            if step is not None
            else {}
        )
        hosts = view.hosts if view is not None else ()
        return {
            "run": context.run,
            "host": hosts[0] if len(hosts) == 1 else None,
            "metrics": window,
            "gpu_devices": store.devices(context.run),
            "run_start": view.run_start if view is not None else None,
        }

    def _current_event(self) -> EventRecord:
        context = self.context
        assert context is not None
        return context.store.event(context.run, context.event.id) or context.event

    def action_new_incident(self) -> None:
        if self.context is None:
            self.action_new_blank()
            return
        knowledge = self._knowledge
        if knowledge is not None and knowledge.recorded_in and time.monotonic() > self._confirm_new_until:
            self._confirm_new_until = time.monotonic() + CONFIRM_NEW_S
            existing = knowledge.recorded_in[0]
            self._select(existing.number)
            self.notify(
                f"this event is already in {existing.ref}; press n again to open another incident for it",
                timeout=CONFIRM_NEW_S,
                markup=False,
            )
            return
        self._confirm_new_until = 0.0
        event, captured = self._current_event(), self._capture()
        self._submit("open", lambda kb: kb.open_from_event(event, **captured))

    def action_new_blank(self) -> None:
        context = self.context

        def opened(title: str | None) -> None:
            if title:
                draft = IncidentDraft(title=title, run=context.run if context else None)
                self._submit("open", lambda kb: kb.open_incident(draft))

        self.app.push_screen(
            TextDialog("New incident", "Title", placeholder="e.g. loss spike after warm-up on node7"), opened
        )

    def _select(self, number: int) -> None:
        """Highlight incident ``number`` (searching and filtering stop if they hide it)."""
        listing = self.query_one(IncidentList)
        try:
            listing.highlighted = listing.get_option_index(str(number))
        except OptionDoesNotExist:
            self._keep = number
            self.where = NO_FILTER
            self.query_one("#kb-search", Input).value = ""
            self.reload()

    def _text_entry(self, what: str, label: str, placeholder: str, write: Callable[..., Entry]) -> None:
        number = self.selected_number()
        if number is None:
            return

        def entered(text: str | None) -> None:
            if text:
                self._submit(what, lambda kb: write(kb, number, text))

        self.app.push_screen(TextDialog(f"{label} for #{number}", label, placeholder=placeholder), entered)

    def action_note(self) -> None:
        self._text_entry(
            "note",
            "Note",
            "what you saw, think or did (enter saves)",
            lambda kb, n, text: kb.add_note(n, text),
        )

    def action_result(self) -> None:
        self._text_entry(
            "result",
            "Result",
            "e.g. loss back to 2.1 after 300 steps",
            lambda kb, n, text: kb.add_result(n, text),
        )

    def action_tried(self) -> None:
        number = self.selected_number()
        if number is None:
            return
        step = None
        if self.context is not None:
            view = self.context.store.run_view(self.context.run)
            step = view.step if view is not None else None

        def entered(tried: TriedInput | None) -> None:
            if tried:
                self._submit(
                    "tried", lambda kb: kb.add_tried(number, tried.text, tried.outcome, step=tried.step)
                )

        self.app.push_screen(TriedDialog(f"Tried on #{number}", step), entered)

    def action_status(self) -> None:
        detail = self._detail
        number = self.selected_number()
        if number is None or detail is None or detail.incident.number != number:
            return

        def chosen(choice: tuple[str, str] | None) -> None:
            if choice:
                status, note = choice
                self._submit("status", lambda kb: kb.set_status(number, status, note=note))

        self.app.push_screen(StatusDialog(f"Status of #{number}", detail.incident.status), chosen)

    def action_postmortem(self) -> None:
        detail = self._detail
        number = self.selected_number()
        if number is None or detail is None or detail.incident.number != number:
            return

        def edited(changes: dict[str, Any] | None) -> None:
            if changes:
                self._submit("edit", lambda kb: kb.update(number, **changes))

        self.app.push_screen(PostmortemDialog(detail.incident), edited)

    def action_attach(self) -> None:
        number = self.selected_number()
        if number is None or self.context is None:
            return
        event, captured = self._current_event(), self._capture()
        del captured["run_start"]  # the reproduction record was captured when the incident opened
        self._submit("attach", lambda kb: kb.attach_events(number, [event], **captured))

    def action_export(self) -> None:
        number = self.selected_number()
        if number is not None:
            self._submit("export", lambda kb: kb.export(kb.location.path / EXPORT_DIR, [number]))

    def action_filter(self) -> None:
        def chosen(where: IncidentFilter | None) -> None:
            if where is not None:
                self.where = where
                self._load_list(self.search_text, self.where)

        self.app.push_screen(FilterDialog(self.where), chosen)

    def on_runbook_checklist_toggled(self, message: RunbookChecklist.Toggled) -> None:
        number = self.selected_number()
        if number is not None:
            runbook, step, checked = message.runbook, message.step, message.checked
            self._submit("tick", lambda kb: kb.tick_step(number, runbook, step, checked=checked))


def key_sections(app: App[Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The incident screen's keys, as the help screens list them (generated from the bindings)."""
    keys = [
        (app.get_key_display(binding), binding.tooltip or binding.description)
        for binding in IncidentScreen.BINDINGS
        if isinstance(binding, Binding)
    ]
    keys += [
        ("↑ ↓", "Move in the list; the right side shows the highlighted incident"),
        ("enter / tab", "Go to the runbook checklist (escape comes back)"),
        ("space / enter", "Tick or untick the highlighted runbook step"),
    ]
    return [("Incident screen (i)", keys), ("Incident dialogs", DIALOG_KEYS)]
