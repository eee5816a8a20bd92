"""Two runs compared: what ``tuimon diff`` reports and what ``--baseline`` draws and watches.

One rule decides when two runs' curves part (:mod:`tuimon.compare.curves`); ``tuimon diff`` applies
it to two whole runs (:mod:`tuimon.compare.report`), the dashboard to a run as it arrives against a
baseline recording (:mod:`tuimon.compare.band`). No Textual here.
"""
