"""The tail the bench scripts share: write the result as JSON (bench/results/ by
convention; README and docs quote figures only from committed JSON).

Each script prints its own table (their columns and units differ) and then calls
`write_json`. Scripts import it as ``from _report import write_json`` (bench/ is the
folder of the script being run, so it is on ``sys.path``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["write_json"]


def write_json(path: str | Path, result: Any, *, indent: int = 1,
               default: Callable[[Any], Any] | None = None) -> Path:
    """Write `result` to `path` as JSON with `indent` spaces and a trailing newline,
    creating missing parent folders; keys keep their insertion order.

    Args:
        path: the JSON file (overwritten).
        result: anything ``json.dumps`` takes (with `default` for other values).
        indent: spaces per level (scripts keep the indent their committed JSON has).
        default: ``json.dumps``'s fallback for values it cannot encode (e.g. ``str``).

    Returns:
        `path` as a Path.

    Raises:
        TypeError: a value JSON cannot encode and no `default`.
        OSError: the file cannot be written.
    """
    path = Path(path)
    text = json.dumps(result, indent=indent, default=default) + "\n"  # encode before opening
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
