"""The Textual app (:mod:`~tuimon.ui.app`): the dashboard screen and its panels (``dashboard/``), the
screens pushed over it (event detail, help, the job view, the layer panel, the incident knowledge
base in ``incidents/``), the services that do blocking work off the UI thread (``services/``),
themes and text formatting.

The only package that imports textual (checked by import-linter).
"""
