"""What crosses the process boundary: the message format, the socket that sends it, the recording
that keeps it, and the registry that lets a viewer find it.

The only part of ``publisher`` the viewer imports (``tuimon`` reads :mod:`~publisher.wire.protocol`,
:mod:`~publisher.wire.registry`, :mod:`~publisher.wire.event_kinds` and
:mod:`~publisher.wire.recorder`); nothing here imports torch.
"""
