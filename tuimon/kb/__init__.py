"""The incident knowledge base: SQLite (WAL, FTS5) shared by everyone on the node, Markdown runbooks
and exports. :class:`KnowledgeBase` is the entry point; see ``docs/incidents.md``.

Modules, one job each: ``location`` (where it lives, who writes), ``db`` (connection, write
transactions), ``schema`` (migrations, search indexes), ``model`` (records, normalisation),
``incidents`` (operations), ``capture`` (evidence from events), ``search``, ``similar``,
``runbooks``, ``mdformat``/``export``/``markdown_import`` (Markdown files), ``sync``/``gitrepo``/
``merge3`` (sharing through git), ``api`` (the facade).
"""

from tuimon.kb.api import ImportReport, KnowledgeBase
from tuimon.kb.incidents import IncidentFilter
from tuimon.kb.model import ContextRecord, Entry, Incident, IncidentDraft
from tuimon.kb.search import SearchHit, Snippet
from tuimon.kb.similar import SeenBefore

__all__ = [
    "ContextRecord",
    "Entry",
    "ImportReport",
    "Incident",
    "IncidentDraft",
    "IncidentFilter",
    "KnowledgeBase",
    "SearchHit",
    "SeenBefore",
    "Snippet",
]
