"""Relays: one per node gathers its ranks' streams, a root gathers the nodes, a viewer connects to one
address. Forwarding is ZeroMQ's own proxy (XSUB -> XPUB, in C); Python wires sockets, finds
publishers, reports the relay's health and, at a node, lets only valid frames of its ranks into the
proxy. Nothing here imports Textual."""
