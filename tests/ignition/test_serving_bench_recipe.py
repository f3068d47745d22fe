"""recipes/llama_serving_bench.py: capacities for served-throughput benchmarks, KV pages
sized from the checkpoint's geometry (256 requests of 2,048 tokens, or 512 where they fit,
capped at 112 GiB of bfloat16 cache planes: exported with --kv-cache-dtype bf16), decode
buckets every 32 rows past 64."""

from __future__ import annotations

from helios_ignition.checkpoint import random_checkpoint
from helios_ignition.export import resolve_recipe

RECIPE = "recipes/llama_serving_bench.py"


def test_llama_8b_geometry_holds_256_full_length_requests():
    recipe = resolve_recipe(RECIPE, random_checkpoint("llama-3.1-8b", 0))
    caps = recipe.capacities
    assert recipe.name == "llama-3.1-8b-serving-bench"
    assert caps.decode_batch == (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256)
    assert caps.prefill_tokens == (16, 128, 1024) and caps.context_tokens == 4096
    # 32 layers x 2 planes x 8 kv heads x 128 x 2 bytes x 16 tokens = 2 MiB per page: 256
    # requests of 128 pages take 64 GiB of the 112 (512 would take 128).
    assert caps.prepared_pages == 256 * 2048 // 16 == 32768
    assert recipe.serving.max_active == 256
    # MIXED budgets of 512 tokens (64 lanes leave 448 prompt tokens per step) and 2,048
    # (a burst of prompts).
    assert caps.mixed_tokens == (512, 2048)
    assert recipe.activation_dtype == "bf16"  # the packed products' activations rounded


def test_smollm2_geometry_decodes_512_rows_with_every_page_they_need():
    recipe = resolve_recipe(RECIPE, random_checkpoint("smollm2-135m", 0))
    assert recipe.name == "smollm2-135m-serving-bench"
    # 30 layers x 2 x 3 kv heads x 64 x 2 bytes x 16 tokens = 360 KiB per page: 512
    # requests of 128 pages take 22.5 GiB of the 112.
    assert recipe.capacities.prepared_pages == 512 * 2048 // 16
    assert recipe.capacities.decode_batch[-5:] == (256, 320, 384, 448, 512)
    assert recipe.serving.max_active == recipe.serving.queue_capacity == 512
