"""The tail the bench scripts share: write the result as JSON (bench/results/ by
convention; README and docs quote figures only from committed JSON).

Each script prints its own table (their columns and units differ) and then calls
`write_json`, naming the code it measured with `git_commit`. Scripts import them as
``from _report import git_commit, write_json`` (bench/ is the folder of the script
being run, so it is on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["git_commit", "write_json"]


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


def git_commit(tree: str | Path | None = None) -> str | None:
    """The HELIOS_COMMIT environment variable when set (the device machine's copy of the
    tree carries no usable .git: bench/gpu_device.sh's caller sets it); else the short
    commit checked out at `tree` (default: this checkout); else None.

    A working tree with uncommitted changes still reports HEAD: results name the commit
    they were measured on only when run from a clean tree.
    """
    if os.environ.get("HELIOS_COMMIT"):
        return os.environ["HELIOS_COMMIT"]
    tree = Path(tree) if tree is not None else Path(__file__).resolve().parents[1]
    if not (tree / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=False)
    except OSError:  # no git on this machine
        return None
    return out.stdout.strip() or None
