"""The family registry: which families a recipe may declare.

`FAMILIES` names each family a recipe may declare (`Recipe.family`) with its shapes class
(a `capture.family.Family` with `from_geometry`) and the checkpoint architecture it reads
(the geometry's `architecture`; a Llama geometry has none and is "llama"). How to add a
family: docs/families.md.
"""

from __future__ import annotations

from typing import NamedTuple

from .gemma3 import Gemma3Shapes
from .llama import LlamaShapes


class FamilyEntry(NamedTuple):
    shapes: type
    architecture: str


FAMILIES: dict[str, FamilyEntry] = {
    "gemma3": FamilyEntry(Gemma3Shapes, "gemma3"),
    "llama": FamilyEntry(LlamaShapes, "llama"),
}


class FamilyMismatchError(ValueError):
    """The checkpoint's architecture is not the one the recipe's family reads."""


def family_shapes(family: str, geometry):
    """The shapes of `family` for a checkpoint `geometry` (one rank's: `.shard(n)` splits).

    Raises:
        KeyError: `family` is not in `FAMILIES` (recipes are validated before this).
        FamilyMismatchError: the checkpoint is of another architecture (names both).
    """
    entry = FAMILIES[family]
    architecture = getattr(geometry, "architecture", "llama")
    if architecture != entry.architecture:
        raise FamilyMismatchError(
            f"the checkpoint's architecture is {architecture!r}, but family {family!r} reads "
            f"{entry.architecture!r}")
    return entry.shapes.from_geometry(geometry)
