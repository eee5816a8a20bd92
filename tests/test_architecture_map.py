"""The maps of the tree stay true: every module of publisher/ and tuimon/ has its row in
docs/architecture.md, every row names a module that exists, and the README's layout names every
folder. A newcomer reads these before the code; a map that lags sends them to the wrong room."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("publisher", "tuimon")
#: A heading of the module map: ``### `publisher/`: the training side``.
_HEADING = re.compile(r"^### `(\w+)/`")


def modules(package: str) -> set[str]:
    """Every module of ``package``, relative to it (``wire/protocol.py``); packages' ``__init__``
    files are their folders' rows."""
    folder = ROOT / package
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def mapped(package: str) -> set[str]:
    """The modules the map's table for ``package`` names. In a cell, a name without a folder is in
    the folder of the name before it (``kb/db.py``, ``schema.py`` is ``kb/schema.py``)."""
    names: set[str] = set()
    inside = False
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        heading = _HEADING.match(line)
        if heading or line.startswith("## "):
            inside = bool(heading) and heading.group(1) == package
            continue
        if inside and line.startswith("| "):
            folder = ""
            for name in re.findall(r"`([^`]+\.py)`", line.split(" | ")[0]):
                if "/" in name:
                    folder = name.rpartition("/")[0] + "/"
                    names.add(name)
                else:
                    names.add(folder + name)
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_has_its_row_in_the_map(package: str) -> None:
    missing = sorted(modules(package) - mapped(package))
    assert not missing, f"docs/architecture.md's map of {package}/ lacks: {', '.join(missing)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_row_of_the_map_names_a_module_that_exists(package: str) -> None:
    gone = sorted(mapped(package) - modules(package) - {"__init__.py"})
    assert not gone, f"docs/architecture.md's map of {package}/ names modules that do not exist: {gone}"


def test_the_readme_layout_names_every_folder() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    block = layout[layout.index("```") + 3:]
    block = block[: block.index("```")]
    folders = {
        f"{path.name}/"
        for package in PACKAGES
        for path in (ROOT / package).iterdir()
        if (path / "__init__.py").is_file()
    }
    named = set(re.findall(r"\b(\w+/)", block))
    assert folders <= named, f"README's layout lacks {sorted(folders - named)}"


#: A project issue cited by its number: it says nothing to a reader who has no tracker.
_ISSUE_NUMBER = re.compile(r"\b[Ii]ssue [0-9]+")


def test_source_tests_and_benchmarks_say_what_and_why_not_which_issue() -> None:
    """Code and its comments say what they do and why, and cite public sources; a project issue's
    number means nothing to a reader of the code, and measurements belong in docs/benchmarks.md."""
    cited = [f"{path.relative_to(ROOT)}:{number}"
             for folder in (*PACKAGES, "tests", "benchmarks") for path in (ROOT / folder).rglob("*.py")
             if "__pycache__" not in path.parts
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _ISSUE_NUMBER.search(line)]
    assert not cited, cited
