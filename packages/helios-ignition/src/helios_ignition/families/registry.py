"""The family registry: a recipe's `family` -> the shapes class that captures it; each
class builds itself from a checkpoint's geometry (`from_geometry`)."""

from __future__ import annotations

from .llama import LlamaShapes
from .qwen3 import Qwen3MoeShapes, Qwen3Shapes

FAMILIES = {"llama": LlamaShapes, "qwen3": Qwen3Shapes, "qwen3_moe": Qwen3MoeShapes}


class FamilyMismatchError(ValueError):
    """A recipe's family does not capture its checkpoint's architecture."""


def family_shapes(family: str, geometry):
    """The shapes of `family` for a checkpoint `geometry` (a geometry names its family in
    `family`; Llama's names none).

    Raises:
        FamilyMismatchError: `family` is unknown or not the checkpoint's (names both).
    """
    found = getattr(geometry, "family", "llama")
    if family not in FAMILIES:
        raise FamilyMismatchError(f"unknown family {family!r}; supported: "
                                  f"{', '.join(FAMILIES)}")
    if family != found:
        raise FamilyMismatchError(f"the recipe's family {family!r} does not capture this "
                                  f"checkpoint, whose architecture is family {found!r}")
    return FAMILIES[family].from_geometry(geometry)
