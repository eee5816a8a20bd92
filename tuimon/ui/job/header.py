"""The job view's first line: which run, how big (nodes, ranks, GPUs, relays), how far, what is wrong."""

from __future__ import annotations

from collections import Counter

from textual.content import Content
from textual.widgets import Static

from tuimon.store import JobView
from tuimon.ui.job.problems import PROBLEM_KINDS, PROBLEM_LOOK, Problem

_SEPARATOR = Content.styled(" │ ", "$foreground 40%")


def _count(number: int, what: str) -> Content:
    return Content.from_markup("[b]$n[/] $what", n=f"{number:,}", what=what if number == 1 else what + "s")


def _steps(view: JobView) -> str:
    steps = [step for node in view.nodes for step in node.steps if step is not None]
    if not steps:
        return "step —"
    low, high = min(steps), max(steps)
    return f"step {high:,}" if low == high else f"step {high:,} (slowest rank at {low:,})"


class JobHeader(Static):
    DEFAULT_CSS = """
    JobHeader {
        height: 1;
        background: $panel;
        padding: 0 1;
    }
    """

    def show(self, view: JobView, relays: int, problems: list[Problem]) -> None:
        gpus = sum(cell.index is not None for node in view.nodes for cell in node.cells)
        current = Counter(problem.kind for problem in problems if problem.current)
        marks = [
            Content.styled(f"{PROBLEM_LOOK[kind][1]} {current[kind]}", PROBLEM_LOOK[kind][2])
            for kind in PROBLEM_KINDS
            if current[kind]
        ]
        fields = [  # what is wrong before the sizes: a narrow terminal cuts the line's end
            Content.assemble(("job ", "$foreground 70%"), (view.run, "bold $primary")),
            Content(" ").join(marks) if marks else Content.styled("✔ no problems now", "$success"),
            _count(len(view.nodes), "node"),
            _count(view.ranks, "rank"),
            _count(gpus, "GPU"),
            _count(relays, "relay"),
            Content(_steps(view)),
        ]
        self.update(_SEPARATOR.join(fields))
