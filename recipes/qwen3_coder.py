"""Qwen3-Coder recipe: a Qwen3 (dense or MoE) checkpoint served with Qwen3-Coder's chat
template and its tool syntax, the Qwen Coder function tags:

    <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

field for field the frontend preset QWEN_CODER_TAGS (docs/frontend-syntax.md). The
template (recipes/templates/qwen3_coder.jinja, Qwen3-Coder's own, from llama.cpp's
models/templates) renders tools as <function> blocks and emits no reasoning, so no
reasoning syntax is declared. Everything else is recipes/qwen3.py's.
"""

import importlib.util
from dataclasses import replace
from pathlib import Path

from helios_contract.schema import frontend_pb2 as fe

_spec = importlib.util.spec_from_file_location("qwen3", Path(__file__).with_name("qwen3.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

CHAT_TEMPLATE = (Path(__file__).parent / "templates" / "qwen3_coder.jinja").read_text(
    encoding="utf-8")

QWEN_CODER_TOOLS = fe.ToolSyntax(  # = syntax.QWEN_CODER_TAGS
    call_open="<tool_call>", call_close="</tool_call>", function_name_open="<function=",
    function_name_close=">", function_close="</function>", parameter_name_open="<parameter=",
    parameter_name_close=">", parameter_value_close="</parameter>", wrapping_newline="\n",
    tag_separator="\n")


def make_recipe(checkpoint):
    """recipes/qwen3.py's declarations with the Coder template and tool syntax (sampling:
    the Qwen3-Coder model card's temperature 0.7, top_p 0.8, top_k 20,
    repetition_penalty 1.05)."""
    base = _base.make_recipe(checkpoint)
    return replace(
        base, name=_base.served_name(checkpoint, "qwen3-coder-"),
        frontend=_base.frontend(fe.TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS, QWEN_CODER_TOOLS,
                                reasoning=False),
        chat_template=CHAT_TEMPLATE,
        sampling=replace(base.sampling, temperature=0.7, top_p=0.8, top_k=20,
                         repetition_penalty=1.05))
