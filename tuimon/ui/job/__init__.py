"""The job dashboard: every GPU of a job of many nodes on one screen, the loss across ranks, and
what the relays found wrong (stragglers, hangs, lost ranks). Shown when the source is a relay."""
