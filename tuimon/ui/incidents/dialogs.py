"""Quick-entry dialogs of the incident screen: a note (or result, or title), something tried and its
outcome, a status change, the list's filters, the postmortem fields.

Made for the keyboard: the first field has focus, enter saves from any one-line field, escape
cancels, tab moves on; choices are lists where the highlighted line is the choice (arrows pick,
enter saves). Input is checked with the knowledge base's own normalisers, and a problem is shown
in the dialog, which stays open with what was typed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.widgets import Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from tuimon.errors import UserError
from tuimon.kb import Incident, IncidentFilter
from tuimon.kb.model import STATUSES, TEXT_FIELD_LABELS, TEXT_FIELDS, labels, parse_date
from tuimon.ui.dialog import Dialog
from tuimon.ui.incidents.format import outcome_label, status_label

T = TypeVar("T")

#: Outcomes in the order the dialog lists them; "unknown" is highlighted first (it is honest).
OUTCOME_CHOICES = ("helped", "no_effect", "made_worse", "unknown")
#: Status filter choices: label -> statuses.
STATUS_FILTERS: dict[str, tuple[str, ...]] = {
    "any status": (),
    "not resolved": tuple(s for s in STATUSES if s != "resolved"),
    **{status: (status,) for status in STATUSES},
}
#: Keys every dialog shares, for the help screen.
DIALOG_KEYS = [
    ("enter", "Save (in a one-line field or a list)"),
    ("ctrl+s", "Save (postmortem dialog, whose fields take several lines)"),
    ("tab", "Next field"),
    ("escape", "Cancel"),
]


class EntryDialog(Dialog[T]):
    """A centred box: a title, the keys, an error line (all three at the top, so that they stay in
    view when the fields scroll), then the fields; escape cancels."""

    DEFAULT_CSS = """
    EntryDialog > .dialog-box {
        border: thick $accent;
    }
    EntryDialog .dialog-title {
        text-style: bold;
        color: $primary;
    }
    EntryDialog Label {
        margin-top: 1;
        color: $foreground 80%;
    }
    EntryDialog OptionList {
        height: auto;
        max-height: 8;
    }
    EntryDialog TextArea {
        height: 3;
    }
    EntryDialog .dialog-error {
        color: $error;
        text-style: bold;
        height: auto;
    }
    EntryDialog .dialog-hint {
        color: $foreground 60%;
    }
    """
    WIDTH = 96
    BOX_FOCUSABLE = False  # the first field gets the focus
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    HINT = "enter: save · tab: next field · escape: cancel"

    def __init__(self, title: str) -> None:
        super().__init__()
        self.dialog_title = title

    def content(self) -> ComposeResult:
        yield Static(self.dialog_title, classes="dialog-title", markup=False)
        yield Static(self.HINT, classes="dialog-hint", markup=False)
        yield Static("", classes="dialog-error", markup=False)
        yield from self.fields()

    def fields(self) -> ComposeResult:
        yield from ()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def show_error(self, message: str) -> None:
        self.query_one(".dialog-error", Static).update(message)

    def save(self) -> None:
        """Check the fields and dismiss with the result (or show what is wrong)."""
        try:
            result = self.result()
        except UserError as exc:
            self.show_error(str(exc))
            return
        self.dismiss(result)

    def result(self) -> T:
        raise NotImplementedError

    @on(Input.Submitted)
    @on(OptionList.OptionSelected)
    def _enter(self, event: Input.Submitted | OptionList.OptionSelected) -> None:
        event.stop()
        self.save()


def _choices(
    values: tuple[str, ...], render: Callable[[str], Content], initial: str, *, id: str
) -> OptionList:
    options = OptionList(*(Option(render(value), id=value) for value in values), id=id)
    options.highlighted = values.index(initial) if initial in values else 0
    return options


def _chosen(dialog: EntryDialog, selector: str) -> str:
    option = dialog.query_one(selector, OptionList).highlighted_option
    assert option is not None and option.id is not None
    return option.id


class TextDialog(EntryDialog[str | None]):
    """One line of text: a note, a result, a new incident's title."""

    def __init__(self, title: str, label: str, *, placeholder: str = "", value: str = "") -> None:
        super().__init__(title)
        self.label = label
        self.placeholder = placeholder
        self.value = value

    def fields(self) -> ComposeResult:
        yield Label(self.label, markup=False)
        yield Input(self.value, placeholder=self.placeholder, id="dialog-text")

    def result(self) -> str:
        text = self.query_one("#dialog-text", Input).value.strip()
        if not text:
            raise UserError("type something first (escape cancels)")
        return text


@dataclass(frozen=True)
class TriedInput:
    text: str
    outcome: str
    step: int | None


class TriedDialog(EntryDialog[TriedInput | None]):
    """What was tried, what it did, and at which training step it was applied."""

    def __init__(self, title: str, step: int | None) -> None:
        super().__init__(title)
        self.step = step

    def fields(self) -> ComposeResult:
        yield Label("What did you try?")
        yield Input(placeholder="e.g. lowered the learning rate to 1e-4", id="tried-text")
        yield Label("What did it do? (↑ ↓)")
        yield _choices(OUTCOME_CHOICES, outcome_label, "unknown", id="tried-outcome")
        yield Label("Applied at training step (empty: not tied to a step)")
        yield Input("" if self.step is None else str(self.step), type="integer", id="tried-step")

    def result(self) -> TriedInput:
        text = self.query_one("#tried-text", Input).value.strip()
        if not text:
            raise UserError("say what was tried (escape cancels)")
        step_text = self.query_one("#tried-step", Input).value.strip()
        try:
            step = int(step_text) if step_text else None
        except ValueError:
            raise UserError(f"the step is a whole number, not {step_text!r}") from None
        return TriedInput(text, _chosen(self, "#tried-outcome"), step)


class StatusDialog(EntryDialog[tuple[str, str] | None]):
    """The new status (highlighted: the current one) and why."""

    def __init__(self, title: str, current: str) -> None:
        super().__init__(title)
        self.current = current

    def fields(self) -> ComposeResult:
        yield Label("New status (↑ ↓, enter)")
        yield _choices(STATUSES, status_label, self.current, id="status-choice")
        yield Label("Why (optional)")
        yield Input(placeholder="e.g. stable for 5k steps after lowering the lr", id="status-note")

    def result(self) -> tuple[str, str]:
        return _chosen(self, "#status-choice"), self.query_one("#status-note", Input).value.strip()


class FilterDialog(EntryDialog[IncidentFilter | None]):
    """Narrow the list (and searches) by status, kind, tag, run and creation date."""

    HINT = "enter: apply · empty fields: no filter · tab: next field · escape: cancel"

    def __init__(self, current: IncidentFilter) -> None:
        super().__init__("Filter incidents")
        self.current = current

    def fields(self) -> ComposeResult:
        current = self.current
        chosen = next(
            (label for label, statuses in STATUS_FILTERS.items() if statuses == current.statuses),
            "any status",
        )
        yield Label("Status")
        yield _choices(tuple(STATUS_FILTERS), Content, chosen, id="filter-status")
        for name, label, value, hint in (
            (
                "kind",
                "Event kinds (comma-separated)",
                ", ".join(current.kinds),
                "e.g. loss_spike, grad_explosion",
            ),
            ("tag", "Tags (comma-separated, any of them)", ", ".join(current.tags), "e.g. lr, warmup"),
            ("run", "Run", current.run or "", "run name"),
            ("since", "Created on or after", (current.since or "")[:16], "YYYY-MM-DD[THH:MM]"),
            ("until", "Created before", (current.until or "")[:16], "YYYY-MM-DD[THH:MM]"),
        ):
            yield Label(label)
            yield Input(value, placeholder=hint, id=f"filter-{name}")

    def _value(self, name: str) -> str:
        return self.query_one(f"#filter-{name}", Input).value.strip()

    def result(self) -> IncidentFilter:
        since, until = self._value("since"), self._value("until")
        return IncidentFilter(
            statuses=STATUS_FILTERS[_chosen(self, "#filter-status")],
            kinds=labels([self._value("kind")], "kind"),
            tags=labels([self._value("tag")], "tag"),
            run=self._value("run") or None,
            since=parse_date(since) if since else None,
            until=parse_date(until) if until else None,
        )


class PostmortemDialog(EntryDialog[dict[str, object] | None]):
    """Title, tags and the postmortem fields; only what was changed is written back."""

    HINT = "ctrl+s: save · tab: next field · escape: cancel"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+s", "save", "Save")]

    def __init__(self, incident: Incident) -> None:
        super().__init__(f"Postmortem of {incident.ref}")
        self.incident = incident

    def fields(self) -> ComposeResult:
        yield Label("Title")
        yield Input(self.incident.title, id="pm-title")
        yield Label("Tags (comma-separated)")
        yield Input(", ".join(self.incident.tags), id="pm-tags")
        for name in TEXT_FIELDS:
            yield Label(TEXT_FIELD_LABELS[name])
            yield TextArea(getattr(self.incident, name), id=f"pm-{name}")

    def action_save(self) -> None:
        self.save()

    def result(self) -> dict[str, object]:
        """Changed fields as :meth:`KnowledgeBase.update` takes them (``add_tags``/``remove_tags``)."""
        changes: dict[str, object] = {}
        title = self.query_one("#pm-title", Input).value.strip()
        if not title:
            raise UserError("an incident needs a title")
        if title != self.incident.title:
            changes["title"] = title
        tags = labels([self.query_one("#pm-tags", Input).value], "tag")
        added = [tag for tag in tags if tag not in self.incident.tags]
        removed = [tag for tag in self.incident.tags if tag not in tags]
        if added:
            changes["add_tags"] = added
        if removed:
            changes["remove_tags"] = removed
        for name in TEXT_FIELDS:
            text = self.query_one(f"#pm-{name}", TextArea).text
            if text.strip() != getattr(self.incident, name).strip():
                changes[name] = text
        return changes
