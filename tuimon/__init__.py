"""tuimon: a live terminal monitor for AI model training, and its incident knowledge base."""

__version__ = "0.1.0"
