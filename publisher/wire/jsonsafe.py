"""Turn arbitrary user values (configs, event details) into the JSON the wire protocol allows.

The publisher's sender thread encodes with ``allow_nan=False`` and refuses anything that is not
plain JSON, so values that come from users (a config holding a ``Path``, a tuple, a numpy scalar
or a tensor; event details holding a NaN) are converted once, on the way in, here. Nothing is
dropped: what has no JSON form becomes its ``repr``, so the reader still sees what it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from publisher.wire.protocol import wire_number

#: Nesting deeper than this is cut (a self-referencing config would otherwise recurse forever).
MAX_DEPTH = 20


def json_safe(value: Any, _depth: int = 0) -> Any:
    """A JSON-safe copy of ``value``: dicts with string keys, lists, str, bool, None, numbers.

    Non-finite floats become the protocol's ``"nan"``/``"inf"`` strings; numpy scalars and
    one-element tensors become numbers (through ``.item()``); sequences become lists; anything
    else becomes its ``repr``.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return wire_number(value)
    if _depth >= MAX_DEPTH:
        return repr(value)
    if isinstance(value, Mapping):
        return {str(key): json_safe(item, _depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(item, _depth + 1) for item in value]
    item = getattr(value, "item", None)  # numpy scalars, 0-d / 1-element tensors
    if callable(item) and getattr(value, "ndim", 1) == 0:
        try:
            return json_safe(item(), _depth + 1)
        except (TypeError, ValueError, RuntimeError):
            pass
    return repr(value)
