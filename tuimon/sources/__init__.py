"""Where the viewer's messages come from: live publishers and relays over ZeroMQ
(:mod:`~tuimon.sources.live`), or recordings played back (:mod:`~tuimon.sources.replay`).

:mod:`~tuimon.sources.base` says what the app needs of any source. Nothing here imports textual.
"""
