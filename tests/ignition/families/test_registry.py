"""The family registry and the recipe's list of families name the same families."""

from __future__ import annotations

import pytest
from helios_ignition.families.registry import FAMILIES, FamilyMismatchError, family_shapes
from helios_ignition.recipe import SUPPORTED_FAMILIES


def test_the_recipe_accepts_exactly_the_registered_families():
    assert SUPPORTED_FAMILIES == tuple(FAMILIES) == ("gemma3", "llama", "qwen3", "qwen3_moe")


def test_an_unknown_family_is_refused_naming_the_supported():
    with pytest.raises(FamilyMismatchError) as caught:
        family_shapes("mistral", object())
    assert str(caught.value) == ("unknown family 'mistral'; supported: gemma3, llama, qwen3, "
                                 "qwen3_moe")
