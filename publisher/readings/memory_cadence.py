"""How often memory is read: the reader's defaults, which the memory-growth detector's verdicts
depend on. Apart from :mod:`publisher.readings.memory` because that module imports torch, and the
detector also runs in the publisher's process, which does not."""

from __future__ import annotations

#: Memory is read at least this often...
DEFAULT_INTERVAL_S = 0.1
#: ...and every this many steps, when that is sooner...
DEFAULT_EVERY_STEPS = 4
