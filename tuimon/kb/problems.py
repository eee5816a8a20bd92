"""Problems found in the knowledge base's Markdown files (runbooks, imported incidents).

Both parsers report the same way, "file:line: what is wrong", and skip the file: one broken file
never stops the others from loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class LineError(ValueError):
    """A problem at one line (1-based) of a Markdown file being parsed."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class FileProblem:
    """A file that was skipped, and why: printed as ``path:line: message``."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"
