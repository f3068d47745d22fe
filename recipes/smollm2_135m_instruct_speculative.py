"""SmolLM2-135M-Instruct with its learned drafter: SPECULATIVE programs of widths 1..4.

Everything of recipes/smollm2_135m_instruct.py, plus the EAGLE-style draft head trained by
scripts/train_drafter.py (recipes/drafters/, format in
helios_ignition/checkpoint/drafter.py). `helios-serve --speculative-width N` serves
widths <= N (0: no speculation).
"""

import importlib.util
from dataclasses import replace
from pathlib import Path

from helios_ignition.recipe import DrafterDecl

_spec = importlib.util.spec_from_file_location(
    "smollm2_135m_instruct", Path(__file__).with_name("smollm2_135m_instruct.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

# No MIXED programs: a drafter core's decode rows stay row-invariant with verification
# (recipe.validate_recipe refuses mixed capacities with a drafter).
RECIPE = replace(_base.RECIPE, drafter=DrafterDecl(
    "drafters/smollm2-135m-instruct-eagle.safetensors", widths=(1, 2, 3, 4)),
    capacities=replace(_base.RECIPE.capacities, mixed_tokens=()))
