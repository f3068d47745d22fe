"""Llama-family recipe for served-throughput benchmarks on one H200 (bench/serve_load.py).

Any Llama checkpoint the generic recipe takes (`--checkpoint smollm2`, a GGUF or
safetensors path, or `--random-weights SEED --geometry llama-3.1-8b`), captured for high
concurrency: decode batches up to 256 rows, prefill chunks up to 1,024 tokens over 8
rows, a 4,096-token context (a 1,024-token prompt plus 1,024 output tokens with room for
the chat template), and a default of 256 running requests.

KV pages: the cache planes are float32 (`capture/buffers.py`), so a token costs
layers x 2 x kv_heads x head_dim x 4 bytes (Llama-3.1-8B: 256 KiB; SmolLM2-135M: 45 KiB).
The prepared pages are what 256 requests of 2,048 tokens (1k in + 1k out) need, capped at
KV_BUDGET_BYTES: 112 GiB of the H200's ~139 GiB, after 15 GiB of 8B bf16 weights and the
activation and logits buffers. For the 8B geometry the cap applies: 28,672 pages of 16
tokens = 458,752 tokens, i.e. 224 such requests at full length at once (at concurrency
256 the scheduler queues or preempts the rest); SmolLM2 gets all 32,768 pages it needs.
"""

import re
from pathlib import Path

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults, ServingDefaults

PAGE_TOKENS = 16
CONCURRENCY = 256
REQUEST_TOKENS = 2048  # 1,024 prompt + 1,024 output tokens
KV_BUDGET_BYTES = 112 * 2**30
KV_BYTES = 4  # float32 cache planes


def make_recipe(checkpoint) -> Recipe:
    """Declarations for `checkpoint`, pages sized from its geometry (module docstring)."""
    g = checkpoint.geometry
    page_bytes = g.num_layers * 2 * g.num_kv_heads * g.head_dim * KV_BYTES * PAGE_TOKENS
    wanted = CONCURRENCY * -(-REQUEST_TOKENS // PAGE_TOKENS)
    pages = min(wanted, KV_BUDGET_BYTES // page_bytes)
    source = str(checkpoint.source)  # a path, or "synthetic:<geometry>:seed=<n>"
    base = source.split(":")[1] if source.startswith("synthetic:") else Path(source).stem
    name = re.sub(r"[^a-z0-9.]+", "-", base.lower()).strip("-") or "llama"
    return Recipe(
        name=f"{name}-serving-bench",
        family="llama",
        checkpoint=str(checkpoint.source),
        frontend=fe.FrontendContract(
            tool_parser=fe.TOOL_PARSER_NONE,
            reasoning_parser=fe.REASONING_PARSER_NONE,
            image_preparation=fe.IMAGE_PREPARATION_NONE,
            image_layout=fe.IMAGE_LAYOUT_NONE,
        ),
        sampling=SamplingDefaults(temperature=0.0, max_output_tokens=1024),
        capacities=Capacities(decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                              prefill_tokens=(16, 128, 1024), prefill_rows=8,
                              context_tokens=4096, page_tokens=PAGE_TOKENS,
                              prepared_pages=int(pages)),
        serving=ServingDefaults(max_active=CONCURRENCY, queue_capacity=CONCURRENCY,
                                frontend_workers=4, event_capacity=256),
        weight_dtype="bf16",
    )
