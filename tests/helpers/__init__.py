"""What the tests build and drive, shared by their modules (``conftest.py`` keeps the fixtures).

Each module holds one kind of thing: synthetic runs and recordings (:mod:`helpers.runs`,
:mod:`helpers.recordings`), a job of many nodes (:mod:`helpers.jobs`), sources and peers the test
drives itself (:mod:`helpers.sources`, :mod:`helpers.peers`, :mod:`helpers.publisher_client`),
processes and terminals (:mod:`helpers.cli`), waiting (:mod:`helpers.waiting`), ports
(:mod:`helpers.ports`), relays (:mod:`helpers.relays`) and a tiny language model
(:mod:`helpers.tiny_lm`). Everything is real: messages are built with ``publisher.wire.protocol``,
recordings are files, peers are ZeroMQ sockets on 127.0.0.1.
"""
