"""The incident knowledge base on screen: the incident screen, its dialogs, the incident list, the
runbook checklist and the text they show. They reach the knowledge base only through
:class:`~tuimon.ui.services.kb_link.KbLink` (threads), never from the UI thread, and never import
the dashboard that opens them."""
