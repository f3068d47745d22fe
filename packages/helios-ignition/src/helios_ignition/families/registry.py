"""The family registry: which families a recipe may declare.

`FAMILIES` maps each family a recipe may declare (`Recipe.family`) to its shapes class (a
`capture.family.Family` that builds itself from a checkpoint's geometry: `from_geometry`).
A geometry names the family that captures it in `family` (Llama's names none and is
"llama"). How to add a family: docs/families.md.
"""

from __future__ import annotations

from .gemma3 import Gemma3Shapes
from .llama import LlamaShapes
from .qwen3 import Qwen3MoeShapes, Qwen3Shapes

FAMILIES = {"gemma3": Gemma3Shapes, "llama": LlamaShapes, "qwen3": Qwen3Shapes,
            "qwen3_moe": Qwen3MoeShapes}


class FamilyMismatchError(ValueError):
    """A recipe's family does not capture its checkpoint's architecture."""


def family_shapes(family: str, geometry):
    """The shapes of `family` for a checkpoint `geometry` (one rank's: `.shard(n)` splits).

    Raises:
        FamilyMismatchError: `family` is unknown, or not the checkpoint's: one line naming
            the checkpoint's architecture, its family, `family` and the supported ones.
    """
    found = getattr(geometry, "family", "llama")
    if family not in FAMILIES:
        raise FamilyMismatchError(f"unknown family {family!r}; supported: "
                                  f"{', '.join(FAMILIES)}")
    if family != found:
        # The name its reader recorded; a Llama geometry records none.
        architecture = getattr(geometry, "architecture", "LlamaForCausalLM")
        raise FamilyMismatchError(f"architecture {architecture!r} is family {found!r}, not "
                                  f"the recipe's family {family!r}; supported families: "
                                  f"{', '.join(FAMILIES)}")
    return FAMILIES[family].from_geometry(geometry)
