"""How to install an optional part of tuimon, said the same way wherever one is missing, and how to
spell a command so that it runs as printed.

tuimon is installed from its repository, not from a package index, so a hint such as
``pip install 'tuimon[torch]'`` names nothing a user can install. The hint instead lists the
packages the extra stands for, as this installation's own metadata declares them
(``pyproject.toml``'s ``[project.optional-dependencies]``), for the Python that is running: the
command works wherever it is pasted, in or out of a virtual environment.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "tuimon"
#: ``name>=1.0; extra == "torch"`` as importlib.metadata gives a requirement.
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_requirements(extra: str) -> list[str]:
    """The requirements (``torch>=2.1``) that ``extra`` adds, from the installed metadata; [] when
    tuimon's metadata cannot be read (run from a checkout that was never installed)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    wanted = []
    for requirement in declared:
        spec, _, marker = requirement.partition(";")
        found = _EXTRA_MARKER.search(marker)
        if found and found.group(1) == extra:
            wanted.append(spec.strip().replace(" ", ""))
    return wanted


def checkout() -> Path | None:
    """The repository this tuimon runs from (an editable install or a plain checkout), if it does."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "tuimon").is_dir() else None


def runnable(name: str, path: str | Path) -> str:
    """``name`` when that is what the PATH runs, else ``path`` (quoted): a command printed for the
    user runs as printed, in or out of the virtual environment it came from."""
    on_path = shutil.which(name)
    return name if on_path and Path(on_path).absolute() == Path(path).absolute() else shlex.quote(str(path))


def python_command() -> str:
    """How to run the running interpreter: ``python``, or its path."""
    return runnable("python", sys.executable)


def install_command(extra: str, *fallback: str) -> str:
    """The command that installs ``extra`` into the running environment (``fallback``: the packages
    to name when tuimon's metadata is not there)."""
    packages = extra_requirements(extra) or list(fallback) or [extra]
    return f"{python_command()} -m pip install {' '.join(shlex.quote(p) for p in packages)}"


def missing(error: ModuleNotFoundError, *, extra: str, needed_by: str) -> ModuleNotFoundError:
    """``error`` (a framework's import failing) said again with the command that installs ``extra``."""
    module = (error.name or extra).partition(".")[0]  # the package to install, not its submodule
    return ModuleNotFoundError(
        f"{needed_by} needs {module}, which is not installed here: {install_command(extra, module)}",
        name=module,
    )
