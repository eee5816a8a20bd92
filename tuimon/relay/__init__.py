"""Relays: one per node gathers its ranks' streams, a root gathers the nodes, a viewer connects to one
address. Forwarding is ZeroMQ's own proxy (XSUB -> XPUB, in C); Python only wires sockets, finds
publishers and reports the relay's health. Nothing here imports Textual."""
