"""The publisher's process: :mod:`publisher.wire.sidecar`, and the detectors that read only the
``metrics`` it publishes (:class:`~publisher.detectors.published.PublishedMetricsDetectors`).

Run as ``python -m publisher.publisher_process`` by
:class:`~publisher.wire.sidecar_link.SidecarPublisher`, never by hand. Imports no torch: it keeps a
few tens of megabytes per rank.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

from publisher.wire.sidecar import Publish, Watcher, serve


def _detectors(settings: dict[str, Any], publish: Publish) -> Watcher:
    # Imported once the process has answered (serve makes the watcher then): the Monitor's start
    # waits for the bind, not for the detectors' ~100 ms of imports.
    from publisher.detectors.published import PublishedMetricsDetectors

    return PublishedMetricsDetectors(settings, publish)


def main() -> int:
    settings = orjson.loads(sys.stdin.buffer.readline())

    def answer(line: dict[str, Any]) -> None:
        sys.stdout.buffer.write(orjson.dumps(line) + b"\n")
        sys.stdout.buffer.flush()

    return serve(settings, answer, _detectors if settings.get("detectors") else None)


if __name__ == "__main__":
    sys.exit(main())
