"""Generic Llama-family recipe: any HF safetensors checkpoint directory, a GGUF file, or
seeded random weights (`--random-weights SEED --geometry llama-3.1-8b`).

Geometry, EOS ids, tokenizer and chat template come from the checkpoint. Sampling
defaults are neutral (greedy) because a generic recipe has no model card. Captured
capacities cover GPU benchmarking: decode batches up to 64, prefill chunks up to 1024.
"""

from pathlib import Path

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults


def make_recipe(checkpoint) -> Recipe:
    """Declarations for `checkpoint` (served id derived from its source name)."""
    name = Path(str(checkpoint.source)).name.lower().replace("_", "-") or "llama"
    return Recipe(
        name=name,
        family="llama",
        checkpoint=str(checkpoint.source),
        frontend=fe.FrontendContract(
            tool_parser=fe.TOOL_PARSER_NONE,
            reasoning_parser=fe.REASONING_PARSER_NONE,
            image_preparation=fe.IMAGE_PREPARATION_NONE,
            image_layout=fe.IMAGE_LAYOUT_NONE,
        ),
        sampling=SamplingDefaults(temperature=0.0, max_output_tokens=1024),
        capacities=Capacities(decode_batch=(1, 2, 4, 8, 16, 32, 64),
                              prefill_tokens=(16, 128, 1024), prefill_rows=8,
                              context_tokens=4096, page_tokens=16, prepared_pages=2048,
                              prepared_snapshots=256, host_tier=True, transfer_rows=64,
                              scored_tokens=(16, 128)),
        weight_dtype="bf16",
    )
