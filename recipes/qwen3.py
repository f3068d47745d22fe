"""Generic Qwen3 recipe (dense `Qwen3ForCausalLM` or `Qwen3MoeForCausalLM`): any HF
safetensors checkpoint directory of either architecture.

The family (qwen3 or qwen3_moe) and geometry come from the checkpoint's config; so do the
tokenizer, EOS ids and the chat template (Qwen3's own: Hermes-style tools rendered into
the system prompt, `<tool_call>` JSON calls, `<think>` reasoning). The declared syntax is
what that template and the model emit: tools JSON_IN_TAGS (`<tool_call>\\n{"name": ...,
"arguments": ...}\\n</tool_call>`) and think-tag reasoning (`<think>` ... `</think>` then
"\\n\\n"; a tool call also ends reasoning), with ChatML boundaries; field for field the
frontend presets JSON_IN_TAGS, THINK_TAGS_DEFAULT with the tool opener as terminal marker
and CHATML_BOUNDARIES (docs/frontend-syntax.md).

Sampling defaults are the Qwen3 model card's for thinking mode (temperature 0.6, top_p
0.95, top_k 20). Capacities cover GPU benchmarking, as recipes/llama.py's.
"""

from pathlib import Path

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults

CHATML_ROLES = (fe.FRONTEND_MESSAGE_ROLE_SYSTEM, fe.FRONTEND_MESSAGE_ROLE_USER,
                fe.FRONTEND_MESSAGE_ROLE_ASSISTANT, fe.FRONTEND_MESSAGE_ROLE_TOOL)


def frontend(tool_parser: int, tool_syntax: fe.ToolSyntax,
             reasoning: bool = True) -> fe.FrontendContract:
    """ChatML boundaries with `tool_syntax`, and think-tag reasoning when `reasoning`."""
    return fe.FrontendContract(
        tool_parser=tool_parser,
        reasoning_parser=(fe.REASONING_PARSER_THINK_TAGS if reasoning
                          else fe.REASONING_PARSER_NONE),
        image_preparation=fe.IMAGE_PREPARATION_NONE,
        image_layout=fe.IMAGE_LAYOUT_NONE,
        tool_syntax=tool_syntax,
        reasoning_syntax=(fe.ReasoningSyntax(open="<think>", close="</think>",
                                             terminal_markers=[tool_syntax.call_open],
                                             answer_separator="\n\n")
                          if reasoning else None),
        assistant_boundaries=fe.AssistantBoundaries(
            message_end_markers=["<|im_end|>"], assistant_header="<|im_start|>assistant"),
        prefix_boundary_rules=[fe.PrefixBoundaryRule(role=role, end_marker="<|im_end|>\n")
                               for role in CHATML_ROLES],
    )


HERMES_TOOLS = fe.ToolSyntax(  # = syntax.JSON_IN_TAGS
    call_open="<tool_call>", call_close="</tool_call>", wrapping_newline="\n",
    tag_separator="\n", json_name_key="name", json_arguments_key="arguments")

CAPACITIES = Capacities(decode_batch=(1, 2, 4, 8, 16, 32, 64),
                        prefill_tokens=(16, 128, 1024), prefill_rows=8,
                        context_tokens=4096, page_tokens=16, prepared_pages=2048,
                        prepared_snapshots=256, host_tier=True, transfer_rows=64)


def served_name(checkpoint, prefix: str) -> str:
    """`prefix` + the checkpoint folder's (or GGUF file's, less `.gguf`) name, lower case,
    dashes for underscores."""
    return prefix + Path(str(checkpoint.source)).name.removesuffix(".gguf").lower() \
        .replace("_", "-")


def make_recipe(checkpoint) -> Recipe:
    """Declarations for a Qwen3 or Qwen3-MoE `checkpoint` (family from its geometry;
    a checkpoint of another architecture gets the recipe's family "qwen3", which export
    refuses naming both)."""
    return Recipe(
        name=served_name(checkpoint, "qwen3-"),
        family=getattr(checkpoint.geometry, "family", "qwen3"),
        checkpoint=str(checkpoint.source),
        frontend=frontend(fe.TOOL_PARSER_JSON_IN_TAGS, HERMES_TOOLS),
        sampling=SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20,
                                  max_output_tokens=1024),
        capacities=CAPACITIES,
        weight_dtype="bf16",
    )
