"""Zero-code instrumentation: what ``tuimon run`` loads into every Python process it starts.

``tuimon run`` puts :data:`AUTOSTART_DIR` on ``PYTHONPATH``; the ``sitecustomize`` there installs
:mod:`publisher.autohook.hooks`. Importing this package costs nothing (no torch).
"""

from __future__ import annotations

from pathlib import Path

#: The folder ``tuimon run`` puts on ``PYTHONPATH``: it holds only ``sitecustomize.py``.
AUTOSTART_DIR = Path(__file__).resolve().parent / "_autostart"
