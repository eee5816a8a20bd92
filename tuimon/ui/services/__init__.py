"""Blocking work the UI hands to threads of its own (SQLite reads and writes, change polling), with
results posted back as Textual messages."""
