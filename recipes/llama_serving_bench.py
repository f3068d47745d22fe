"""Llama-family recipe for served-throughput benchmarks on one H200 (bench/serve_load.py).

Any Llama checkpoint the generic recipe takes (`--checkpoint smollm2`, a GGUF or
safetensors path, or `--random-weights SEED --geometry llama-3.1-8b`), captured for high
concurrency: decode batches up to 256 rows (512 where the KV cache holds 512 requests
of 2,048 tokens: SmolLM2), prefill chunks up to 1,024 tokens over 8 rows, a 4,096-token
context (a 1,024-token prompt plus 1,024 output tokens with room for the chat template),
and a default of that many running requests.

Decode buckets (one captured graph each; a step runs the smallest that holds its rows):
powers of two to 64, then every 32 rows to 256 and every 64 rows to 512, so a step past
64 rows pads at most 31 rows of 96 (at most 63 of 320 past 256); the served padding
fraction is /metrics' helios_decode_padded_rows over helios_decode_rows plus it
(bench/serve_load.py reports it per level).

KV pages: exported with `--kv-cache-dtype bf16` (bench/gpu_device.sh export-8b; as every
serving engine stores a bf16 model's cache: docs/kv-cache.md), the cache planes hold
bfloat16, so a token costs layers x 2 x kv_heads x head_dim x 2 bytes (Llama-3.1-8B:
128 KiB; SmolLM2-135M: 22.5 KiB); exported without it (f32 planes) a token costs twice
that, and the physical page count chosen at startup from the memory left is half.
The prepared pages are what the running requests at 2,048 tokens each (1k in + 1k out)
need, capped at KV_BUDGET_BYTES: 112 GiB of the H200's ~139 GiB, after 15 GiB of 8B bf16
weights and the activation and logits buffers. For the 8B geometry 256 requests fit
(512 would need 128 GiB): 32,768 pages of 16 tokens = 524,288 tokens, all 256 requests
at full length at once (64 GiB; on an H100, whose ~56 GiB left after loading hold about
459k bf16 tokens, 224 such requests, the scheduler queues or preempts the rest); SmolLM2 gets
all 65,536 pages 512 requests need (22.5 GiB).

MIXED steps (docs/mixed.md): two token budgets, 512 and 2,048 packed tokens (Sarathi-Serve's
strict and relaxed time-between-tokens budgets). The scheduler picks one per step
("Token budget"): a burst, where at least as many prompts owe tokens as streams decode,
gets 2,048 (64 clients sending 1k prompts at once are prefilled 2,047 tokens a step
instead of 511, for time to first token); prompts arriving into more running streams
than themselves get 512 (64 lanes leave 448 prompt tokens, so a 1k prompt joins over 3
steps and the streams' step stays short, for inter-token latency). One MIXED program per
decode batch and budget (12 more for the 8B geometry, 16 for SmolLM2); the activation
buffers are sized by 2,048 tokens instead of the 1,024-token prefill capacity: 8B
1,021 MiB of scratch instead of 709 (+312 MiB: the FFN's gate/up, act and packed-product
terms double), SmolLM2 233 MiB instead of 202. On an H100, whose pages come from the
memory left after loading, that is about 2,500 bf16 8B tokens (156 pages) fewer; on an
H200 the prepared pages still fit.

Activations: bf16 (``Recipe.activation_dtype``, docs/gpu.md "bf16 activations"): the
packed tensor-core products (the 8B geometry's matrices) multiply activations rounded to
bf16 by ``round_bf16``, one MMA term instead of two. Greedy identity with the cpu backend
holds by construction: the core declares the rounding as an op both backends execute
(the cpu backend's NumPy reference rounds exactly as the kernel does), so cuda and cpu
multiply the same values. Checkpoints whose matrices stay off the packed path (SmolLM2)
keep f32 activations everywhere.
"""

import re
from pathlib import Path

from helios_contract.schema import frontend_pb2 as fe
from helios_ignition.recipe import Capacities, Recipe, SamplingDefaults, ServingDefaults

PAGE_TOKENS = 16
CONCURRENCY = 256  # at least; 512 where the KV budget holds 512 full-length requests
MAX_CONCURRENCY = 512
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
REQUEST_TOKENS = 2048  # 1,024 prompt + 1,024 output tokens
KV_BUDGET_BYTES = 112 * 2**30
KV_BYTES = 2  # bfloat16 cache planes (--kv-cache-dtype bf16)
# MIXED steps (docs/mixed.md): decode lanes first, then prompt chunks; 2,048 tokens a step
# while prompts owing tokens are at least as many as the lanes, else 512 (module docstring).
MIXED_TOKENS = (512, 2048)


def make_recipe(checkpoint) -> Recipe:
    """Declarations for `checkpoint`, pages sized from its geometry (module docstring)."""
    g = checkpoint.geometry
    page_bytes = g.num_layers * 2 * g.num_kv_heads * g.head_dim * KV_BYTES * PAGE_TOKENS
    per_request = -(-REQUEST_TOKENS // PAGE_TOKENS)
    fits = MAX_CONCURRENCY * per_request * page_bytes <= KV_BUDGET_BYTES
    rows = MAX_CONCURRENCY if fits else CONCURRENCY
    pages = min(rows * per_request, KV_BUDGET_BYTES // page_bytes)
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
        capacities=Capacities(decode_batch=tuple(b for b in DECODE_BUCKETS if b <= rows),
                              prefill_tokens=(16, 128, 1024), prefill_rows=8,
                              context_tokens=4096, page_tokens=PAGE_TOKENS,
                              prepared_pages=int(pages), mixed_tokens=MIXED_TOKENS),
        serving=ServingDefaults(max_active=rows, queue_capacity=rows,
                                frontend_workers=4, event_capacity=256),
        weight_dtype="bf16",
        activation_dtype="bf16",
    )
