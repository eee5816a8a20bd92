"""The Textual app: the dashboard (:mod:`~tuimon.ui.app`), its panels (``dashboard/``), the screens
pushed over it (event detail, help, the incident knowledge base in ``incidents/``), the services
that do blocking work off the UI thread (``services/``), themes and text formatting.

The only package that imports textual (checked by import-linter).
"""
