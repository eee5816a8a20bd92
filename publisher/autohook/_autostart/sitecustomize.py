"""Loaded by every Python process that ``tuimon run`` starts (it puts this folder on PYTHONPATH).

Installs tuimon's zero-code hooks, then runs the ``sitecustomize`` this file shadows, if any, so
that a site's own start-up code still runs. Any failure leaves the program running unmonitored
with one line on stderr: monitoring must never stop training from starting.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if os.environ.get("TUIMON_AUTOSTART") == "1":
    try:
        from publisher.autohook import hooks

        hooks.install()
    except ModuleNotFoundError as exc:  # another interpreter, without tuimon installed
        ours = os.environ.get("TUIMON_PYTHON", "the Python tuimon is installed in")
        source = os.environ.get("TUIMON_SOURCE", "TUIMON_REPOSITORY")
        print(
            f"tuimon: not monitoring this process: {sys.executable} cannot import tuimon's publisher "
            f"({exc}); run the program with {ours}, or install tuimon into its environment: "
            f"{sys.executable} -m pip install -e {source}",
            file=sys.stderr,
        )
    except Exception as exc:
        print(f"tuimon: not monitoring this process ({type(exc).__name__}: {exc})", file=sys.stderr)


def _run_shadowed_sitecustomize() -> None:
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != _HERE and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_tuimon_shadowed_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_run_shadowed_sitecustomize()
