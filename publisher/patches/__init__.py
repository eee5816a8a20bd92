"""Wrappers installed over torch's own functions, for what shows only in *how* the loop calls them.

``torch_calls.py`` wraps the gradient clipping functions and the losses; ``loss_look.py`` is what a
look at a loss call measures. Patching is kept
apart from the readings (``readings/``) because it is process-wide, not the Monitor's: a wrapper is
installed once, outlives any one Monitor (which registers to hear from it and unregisters at
``close()``), and must be in place before the training script binds the names, which is why
``tuimon run`` installs it as torch is imported (``autohook/``).
"""
