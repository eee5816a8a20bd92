"""The dashboard: its screen (``screen.py``, ``replay.py`` for a recording) and its panels, one
module each. Every panel redraws from copies it takes from the store, and only when the store's
version counter for what it shows has changed."""
