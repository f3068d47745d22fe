"""SmolLM2-135M-Instruct with tools, under its own served name: the embedded default
recipe (recipes/smollm2_135m_instruct.py, which declares the JSON_IN_TAGS tool syntax and
the tool-rendering ChatML template) served as `smollm2-135m-instruct-tools` (alias
`smollm2-tools`), for the tests and examples that name it.
"""

import importlib.util
from dataclasses import replace
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "smollm2_135m_instruct", Path(__file__).with_name("smollm2_135m_instruct.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

CHAT_TEMPLATE = _base.CHAT_TEMPLATE
RECIPE = replace(_base.RECIPE, name="smollm2-135m-instruct-tools", aliases=("smollm2-tools",))
