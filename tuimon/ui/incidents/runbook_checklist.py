"""A runbook as a checklist: every step of the runbooks matching an incident, with who ticked it.

Space or enter on a step asks for it to be ticked (or unticked) with :class:`Toggled`; the screen
writes a timeline entry and the list is redrawn from the knowledge base. Until then the step shows
its new state marked "saving", so the key press is answered at once. When only tick states
changed, the steps are updated in place (the highlight and scroll position stay put).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from tuimon.kb.runbooks import RunbookProgress, StepState
from tuimon.ui.incidents.format import inline_markdown, local_time

_DIM = "$foreground 60%"


def step_prompt(state: StepState, *, saving: bool | None = None) -> Content:
    """``☑ text  alice 12:03`` (``saving`` shows a pending change before it is stored)."""
    checked = state.checked if saving is None else saving
    box = Content.styled("☑ " if checked else "☐ ", "bold $success" if checked else "bold")
    if saving is not None:
        who = Content.styled("  saving…", "italic $warning")
    elif state.checked:
        who = Content.styled(f"  ✓ {state.by} {local_time(state.at)}", _DIM)
    else:
        who = Content("")
    return box + inline_markdown(state.step.text) + who


class RunbookChecklist(OptionList):
    """Steps of ``RunbookProgress`` lists, grouped under their runbook's title and sections."""

    DEFAULT_CSS = """
    RunbookChecklist {
        height: 1fr;
        max-height: 100%;
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        padding: 0 1;
    }
    RunbookChecklist:focus {
        border: round $accent;
    }
    RunbookChecklist > .option-list--option-disabled {
        color: $primary;
        text-style: bold;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "select", "Tick step", tooltip="Tick or untick the highlighted runbook step"),
    ]

    class Toggled(Message):
        """The user asked for ``step`` of ``runbook`` to become ``checked``."""

        def __init__(self, runbook: str, step: str, checked: bool) -> None:
            super().__init__()
            self.runbook = runbook
            self.step = step
            self.checked = checked

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._states: dict[str, tuple[str, StepState]] = {}  # option id -> (runbook name, state)
        self._layout: tuple[tuple[str, str], ...] = ()
        self._saving: dict[str, bool] = {}  # option id -> state asked for, not stored yet

    def show(
        self, progress: Sequence[RunbookProgress], *, empty: str = "no runbook matches its kinds"
    ) -> None:
        """The steps of ``progress`` (``empty``: what to say when there are none)."""
        layout = tuple((p.runbook.name, s.step.id) for p in progress for s in p.steps) or (("", empty),)
        states = {
            f"step-{index}": (p.runbook.name, s)
            for index, (p, s) in enumerate((p, s) for p in progress for s in p.steps)
        }
        done = sum(p.done for p in progress)
        total = sum(len(p.steps) for p in progress)
        self.border_title = (
            f"Runbook: {', '.join(p.runbook.title for p in progress)} ({done}/{total} done)"
            if progress
            else "Runbook"
        )
        self.border_subtitle = "space: tick" if progress else ""
        saving, self._saving = self._saving, {}
        if layout == self._layout and self.option_count:
            for option_id, (_, state) in states.items():
                if self._states[option_id][1] != state or option_id in saving:
                    self.replace_option_prompt(option_id, step_prompt(state))
            self._states = states
            return
        self._layout, self._states = layout, states
        options: list[Option | None] = []
        index = 0
        for runbook in progress:
            if len(progress) > 1:  # one runbook is named in the border title
                options.append(Option(Content.styled(runbook.runbook.title, "bold underline"), disabled=True))
            group = None
            for state in runbook.steps:
                if state.step.group != group:
                    group = state.step.group
                    options.append(Option(Content.styled(group, "bold"), disabled=True))
                options.append(Option(step_prompt(state), id=f"step-{index}"))
                index += 1
        if not progress:
            options.append(Option(Content.styled(empty, "italic"), disabled=True))
        self.set_options(options)
        self.action_first()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        option_id = event.option.id
        if option_id is None or option_id not in self._states:
            return
        name, state = self._states[option_id]
        wanted = not self._saving.get(option_id, state.checked)
        self._saving[option_id] = wanted
        self.replace_option_prompt(option_id, step_prompt(state, saving=wanted))
        self.post_message(self.Toggled(name, state.step.id, wanted))
