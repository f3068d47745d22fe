"""The kernel table: each op's exact parameter list and its NumPy reference.

A launch record names an op and passes its arguments in ``KERNEL_PARAMS[op]`` order:
buffers (device pointers on the GPU; NumPy views on the CPU) first, then scalars. Program
capture and both backends check launches against this table with ``check_launch``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from .attention import (
    attention_decode,
    attention_decode_window,
    attention_prefill,
    attention_prefill_window,
)
from .attention_split import (
    attention_decode_fused,
    attention_decode_merge,
    attention_decode_merge_tuned,
    attention_decode_split,
    attention_decode_split_tuned,
)
from .cache import kv_write, row_copy
from .collective import COLLECTIVE_OPS
from .elementwise import add, gelu_mul, scale, silu_mul
from .embedding import embedding, gather_last
from .experts import moe_align, moe_down, moe_gate_up, moe_route, moe_sum
from .fp8 import (
    linear_add_fp8,
    linear_fp8,
    rmsnorm_linear_fp8,
    swiglu_linear_add_fp8,
    swiglu_linear_fp8,
)
from .fused import (
    linear_add,
    rmsnorm_linear,
    rope_kv_write,
    swiglu_linear,
    swiglu_linear_add,
)
from .int4 import (
    linear_add_int4,
    linear_int4,
    rmsnorm_linear_int4,
    swiglu_linear_add_int4,
    swiglu_linear_int4,
)
from .int8 import (
    embedding_int8,
    linear_add_int4_min,
    linear_add_int8,
    linear_int4_min,
    linear_int8,
    rmsnorm_linear_int4_min,
    rmsnorm_linear_int8,
    swiglu_linear_add_int4_min,
    swiglu_linear_add_int8,
    swiglu_linear_int4_min,
    swiglu_linear_int8,
)
from .kv_bf16 import (
    BF16_PLANE_PARAMS,
    KV_BF16_FORMS,
    attention_decode_fused_bf16kv,
    attention_decode_split_bf16kv,
    attention_decode_split_tuned_bf16kv,
    attention_decode_window_bf16kv,
    attention_prefill_bf16kv,
    attention_prefill_window_bf16kv,
    kv_write_bf16kv,
    rope_kv_write_bf16kv,
)
from .kv_fp8 import (
    KV_FP8_FORMS,
    attention_decode_fused_fp8kv,
    attention_decode_split_fp8kv,
    attention_decode_split_tuned_fp8kv,
    attention_decode_window_fp8kv,
    attention_prefill_fp8kv,
    attention_prefill_window_fp8kv,
    kv_write_fp8kv,
    rope_kv_write_fp8kv,
)
from .linear import linear, linear_invariant
from .linear_splitk import (
    linear_packed,
    linear_packed_rows,
    linear_partial,
    round_bf16,
    split_bf16,
    splitk_reduce,
    splitk_reduce_add,
    swiglu_round_bf16,
    swiglu_split_bf16,
)
from .norm import add_rmsnorm, head_rmsnorm, qk_rmsnorm, rmsnorm
from .pending import slot_gather, slot_scatter
from .rope import rope
from .sampling import sample, sample_biased, score_tokens, token_logprobs
from .sampling_chunks import (
    sample_chunks,
    sample_chunks_mass,
    sample_chunks_nucleus,
    sample_chunks_wide,
    sample_merge,
    sample_merge_nucleus,
    sample_pick,
    sample_race,
    sample_race_mass,
    sample_race_pick,
    sample_race_top,
    sample_rest,
)
from .speculative import (
    draft_sample,
    draft_sample_coupled,
    paged_row_gather_prev,
    paged_row_write,
    spec_allocate,
    spec_candidate_masks,
    spec_confidence,
    spec_copy_candidates,
    spec_copy_drafts,
    spec_draft_inputs,
    spec_pack_rows,
    spec_pack_tokens,
    spec_verify,
    spec_verify_coupled,
)
from .tuning import split_tuning_select, split_tuning_setup, timer_mark
from .vision import (
    bias_add,
    gelu_tanh,
    image_merge,
    layernorm,
    patchify,
    pixel_shuffle,
    position_add,
    window_attention,
)

ParamKind = Literal["buffer", "i32", "f32"]
Direction = Literal["in", "out", "inout"]


class ParamSpec(NamedTuple):
    """One kernel parameter.

    Attributes:
        name: parameter name, as in the reference function.
        kind: ``"buffer"`` (array / device pointer) or a scalar kind ``"i32"`` / ``"f32"``.
        dtype: element dtype of a buffer (``"f32"``, ``"i32"``, ``"u32"``; ``"u8"``: the
            e4m3 codes of an FP8-stored weight; ``"bf16"``: a bf16 cache plane's bit
            patterns, uint16 on the host); None for scalars.
        direction: ``"in"``, ``"out"`` or ``"inout"`` (scalars are always ``"in"``).
    """

    name: str
    kind: ParamKind
    dtype: str | None
    direction: Direction


DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "u8": np.dtype(np.uint8),
    "bf16": np.dtype(np.uint16),
}


def _b(name: str, dtype: str, direction: Direction = "in") -> ParamSpec:
    return ParamSpec(name, "buffer", dtype, direction)


def _i(*names: str) -> tuple[ParamSpec, ...]:
    return tuple(ParamSpec(n, "i32", None, "in") for n in names)


def _f(*names: str) -> tuple[ParamSpec, ...]:
    return tuple(ParamSpec(n, "f32", None, "in") for n in names)


KERNEL_PARAMS: dict[str, tuple[ParamSpec, ...]] = {
    "embedding": (_b("ids", "i32"), _b("table", "f32"), _b("out", "f32", "out"), *_i("T", "D")),
    "rmsnorm": (
        _b("x", "f32"), _b("weight", "f32"), _b("out", "f32", "out"),
        *_i("T", "D"), *_f("eps"),
    ),
    "add_rmsnorm": (
        _b("x", "f32"), _b("residual", "f32", "inout"), _b("weight", "f32"),
        _b("out", "f32", "out"), *_i("T", "D"), *_f("eps"),
    ),
    "linear": (_b("x", "f32"), _b("weight", "f32"), _b("out", "f32", "out"), *_i("T", "N", "K")),
    "qk_rmsnorm": (
        _b("qkv", "f32", "inout"), _b("q_weight", "f32"), _b("k_weight", "f32"),
        *_i("T", "H", "KVH", "HD"), *_f("eps"),
    ),
    # Mixture of experts (kernels/experts.py).
    "moe_route": (
        _b("logits", "f32"), _b("ids", "i32", "out"), _b("weights", "f32", "out"),
        *_i("T", "E", "K", "NORM"),
    ),
    "moe_align": (
        _b("ids", "i32"), _b("sorted_pairs", "i32", "out"), _b("block_expert", "i32", "out"),
        *_i("T", "E", "K", "BT", "NB"),
    ),
    "moe_gate_up": (
        _b("x", "f32"), _b("sorted_pairs", "i32"), _b("block_expert", "i32"),
        _b("w_gate_up", "f32"), _b("act", "f32", "out"), *_i("T", "D", "F", "K", "BT", "NB"),
    ),
    "moe_down": (
        _b("act", "f32"), _b("sorted_pairs", "i32"), _b("block_expert", "i32"),
        _b("w_down", "f32"), _b("weights", "f32"), _b("pair_out", "f32", "out"),
        *_i("T", "D", "F", "K", "BT", "NB"),
    ),
    "moe_sum": (_b("pair_out", "f32"), _b("out", "f32", "out"), *_i("T", "D", "K")),
    "rope": (
        _b("qkv", "f32", "inout"), _b("positions", "i32"), _b("inv_freq", "f32"),
        *_i("T", "H", "KVH", "HD"),
    ),
    "kv_write": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("token_row", "i32"), _b("slot", "i32"),
        _b("page_table", "i32"), _b("k_cache", "f32", "inout"), _b("v_cache", "f32", "inout"),
        *_i("T", "R", "MP", "PT", "H", "KVH", "HD"),
    ),
    "attention_prefill": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("token_row", "i32"), _b("slot", "i32"),
        _b("page_table", "i32"), _b("k_cache", "f32"), _b("v_cache", "f32"),
        _b("out", "f32", "out"),
        *_i("T", "R", "MP", "PT", "H", "KVH", "HD"), *_f("scale"),
    ),
    "attention_decode": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("slot", "i32"), _b("page_table", "i32"),
        _b("k_cache", "f32"), _b("v_cache", "f32"), _b("out", "f32", "out"),
        *_i("B", "MP", "PT", "H", "KVH", "HD"), *_f("scale"),
    ),
    "attention_decode_split": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("slot", "i32"), _b("page_table", "i32"),
        _b("k_cache", "f32"), _b("v_cache", "f32"), _b("part_ml", "f32", "out"),
        _b("part_o", "f32", "out"),
        *_i("B", "MP", "PT", "H", "KVH", "HD", "NS", "SPLIT"), *_f("scale"),
    ),
    "attention_decode_merge": (
        _b("part_ml", "f32"), _b("part_o", "f32"), _b("slot", "i32"), _b("out", "f32", "out"),
        *_i("B", "H", "HD", "NS"),
    ),
    "attention_decode_fused": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("slot", "i32"), _b("page_table", "i32"),
        _b("k_cache", "f32"), _b("v_cache", "f32"), _b("part_ml", "f32", "inout"),
        _b("part_o", "f32", "inout"), _b("arrivals", "i32", "inout"), _b("out", "f32", "out"),
        *_i("B", "MP", "PT", "H", "KVH", "HD", "NS", "SPLIT"), *_f("scale"),
    ),
    "attention_decode_split_tuned": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("slot", "i32"), _b("page_table", "i32"),
        _b("k_cache", "f32"), _b("v_cache", "f32"), _b("part_ml", "f32", "out"),
        _b("part_o", "f32", "out"), _b("choice", "i32"),
        *_i("B", "MP", "PT", "H", "KVH", "HD", "NS", "SPLIT"), *_f("scale"),
    ),
    "attention_decode_merge_tuned": (
        _b("part_ml", "f32"), _b("part_o", "f32"), _b("slot", "i32"), _b("choice", "i32"),
        _b("out", "f32", "out"), *_i("B", "H", "HD", "NS"),
    ),
    # Sliding-window attention (local layers): the causal ops above over the last W tokens.
    "attention_prefill_window": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("token_row", "i32"), _b("slot", "i32"),
        _b("page_table", "i32"), _b("k_cache", "f32"), _b("v_cache", "f32"),
        _b("out", "f32", "out"),
        *_i("T", "R", "MP", "PT", "H", "KVH", "HD", "W"), *_f("scale"),
    ),
    "attention_decode_window": (
        _b("qkv", "f32"), _b("positions", "i32"), _b("slot", "i32"), _b("page_table", "i32"),
        _b("k_cache", "f32"), _b("v_cache", "f32"), _b("out", "f32", "out"),
        *_i("B", "MP", "PT", "H", "KVH", "HD", "W"), *_f("scale"),
    ),
    "head_rmsnorm": (
        _b("qkv", "f32", "inout"), _b("q_weight", "f32"), _b("k_weight", "f32"),
        *_i("T", "H", "KVH", "HD"), *_f("eps"),
    ),
    "gelu_mul": (_b("gate_up", "f32"), _b("out", "f32", "out"), *_i("T", "F")),
    "scale": (_b("x", "f32", "inout"), *_i("T", "D"), *_f("factor")),
    "timer_mark": (_b("stamps", "u32", "inout"), *_i("index")),
    "split_tuning_setup": (
        _b("positions", "i32", "out"), _b("slot", "i32", "out"), _b("page_table", "i32", "out"),
        _b("candidates", "i32", "out"), *_i("B", "MP", "PT", "C", "c0", "c1", "c2", "c3"),
    ),
    "split_tuning_select": (
        _b("stamps", "u32"), _b("candidates", "i32"), _b("choice", "i32", "out"), *_i("C"),
    ),
    "silu_mul": (_b("gate_up", "f32"), _b("out", "f32", "out"), *_i("T", "F")),
    "add": (_b("a", "f32"), _b("b", "f32"), _b("out", "f32", "out"), *_i("T", "D")),
    "gather_last": (
        _b("x", "f32"), _b("query_length", "i32"), _b("out", "f32", "out"), *_i("T", "R", "D"),
    ),
    "rope_kv_write": (
        _b("qkv", "f32", "inout"), _b("positions", "i32"), _b("inv_freq", "f32"),
        _b("token_row", "i32"), _b("slot", "i32"), _b("page_table", "i32"),
        _b("k_cache", "f32", "inout"), _b("v_cache", "f32", "inout"),
        *_i("T", "R", "MP", "PT", "H", "KVH", "HD"),
    ),
    "swiglu_linear": (
        _b("x", "f32"), _b("weight", "f32"), _b("out", "f32", "out"), *_i("T", "N", "K"),
    ),
    "rmsnorm_linear": (
        _b("x", "f32"), _b("norm_weight", "f32"), _b("weight", "f32"), _b("out", "f32", "out"),
        *_i("T", "N", "K"), *_f("eps"),
    ),
    "linear_add": (
        _b("x", "f32"), _b("weight", "f32"), _b("out", "f32", "inout"), *_i("T", "N", "K"),
    ),
    "swiglu_linear_add": (
        _b("x", "f32"), _b("weight", "f32"), _b("out", "f32", "inout"), *_i("T", "N", "K"),
    ),
    # W8A8 forms of the products (kernels/fp8.py): e4m3 weight codes, then their per-row
    # scales ([N, 1] f32, the weight's Buffer.storage.scales), activations quantized per token.
    "linear_fp8": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"), _b("out", "f32", "out"),
        *_i("T", "N", "K"),
    ),
    "linear_add_fp8": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("out", "f32", "inout"), *_i("T", "N", "K"),
    ),
    "rmsnorm_linear_fp8": (
        _b("x", "f32"), _b("norm_weight", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("out", "f32", "out"), *_i("T", "N", "K"), *_f("eps"),
    ),
    "swiglu_linear_fp8": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"), _b("out", "f32", "out"),
        *_i("T", "N", "K"),
    ),
    "swiglu_linear_add_fp8": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("out", "f32", "inout"), *_i("T", "N", "K"),
    ),
    # W4A16 forms of the products (kernels/int4.py): packed 4-bit codes [N, K/2], then
    # their group scales and zero points ([N, K/G] f32 each, Buffer.storage's side buffers).
    "linear_int4": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("weight_zero", "f32"), _b("out", "f32", "out"), *_i("T", "N", "K"),
    ),
    "linear_add_int4": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("weight_zero", "f32"), _b("out", "f32", "inout"), *_i("T", "N", "K"),
    ),
    "rmsnorm_linear_int4": (
        _b("x", "f32"), _b("norm_weight", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("weight_zero", "f32"), _b("out", "f32", "out"), *_i("T", "N", "K"), *_f("eps"),
    ),
    "swiglu_linear_int4": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("weight_zero", "f32"), _b("out", "f32", "out"), *_i("T", "N", "K"),
    ),
    "swiglu_linear_add_int4": (
        _b("x", "f32"), _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("weight_zero", "f32"), _b("out", "f32", "inout"), *_i("T", "N", "K"),
    ),
    # Repacked GGUF weights (kernels/int8.py). INT4_MIN: packed 4-bit codes [N, K/2], then
    # their group scales and minimums ([N, K/G] f32 each); INT8: int8 codes [N, K] (bytes),
    # then their group scales.
    **{f"{op}_int4_min": (
        *([_b("x", "f32")] + ([_b("norm_weight", "f32")] if op == "rmsnorm_linear" else [])),
        _b("weight", "u8"), _b("weight_scale", "f32"), _b("weight_min", "f32"),
        _b("out", "f32", "inout" if op.endswith("_add") else "out"), *_i("T", "N", "K"),
        *(_f("eps") if op == "rmsnorm_linear" else ()),
    ) for op in ("linear", "linear_add", "rmsnorm_linear", "swiglu_linear",
                 "swiglu_linear_add")},
    **{f"{op}_int8": (
        *([_b("x", "f32")] + ([_b("norm_weight", "f32")] if op == "rmsnorm_linear" else [])),
        _b("weight", "u8"), _b("weight_scale", "f32"),
        _b("out", "f32", "inout" if op.endswith("_add") else "out"), *_i("T", "N", "K"),
        *(_f("eps") if op == "rmsnorm_linear" else ()),
    ) for op in ("linear", "linear_add", "rmsnorm_linear", "swiglu_linear",
                 "swiglu_linear_add")},
    "embedding_int8": (
        _b("ids", "i32"), _b("weight", "u8"), _b("weight_scale", "f32"), _b("out", "f32", "out"),
        *_i("T", "D"),
    ),
    # Batched-decode GEMM path (kernels/linear_splitk.py): packed bf16 terms, K-split
    # products, fixed-order reduction.
    "split_bf16": (_b("x", "f32"), _b("out", "f32", "out"), *_i("T", "K")),
    "swiglu_split_bf16": (_b("x", "f32"), _b("out", "f32", "out"), *_i("T", "K")),
    # Their bf16-activation forms: hi | 0 (activations rounded to bf16).
    "round_bf16": (_b("x", "f32"), _b("out", "f32", "out"), *_i("T", "K")),
    "swiglu_round_bf16": (_b("x", "f32"), _b("out", "f32", "out"), *_i("T", "K")),
    "linear_packed": (
        _b("x", "f32"), _b("weight", "f32"), _b("partial", "f32", "out"),
        *_i("T", "N", "K", "S"),
    ),
    "linear_partial": (
        _b("x", "f32"), _b("weight", "f32"), _b("partial", "f32", "out"),
        *_i("T", "N", "K", "S"),
    ),
    # linear_packed with one tile and K split per matrix at every row count (drafter
    # cores' row-invariant products on the packed path: capture.launch.invariant_splits)
    "linear_packed_rows": (
        _b("x", "f32"), _b("weight", "f32"), _b("partial", "f32", "out"),
        *_i("T", "N", "K", "S"),
    ),
    "splitk_reduce": (
        _b("partial", "f32"), _b("out", "f32", "out"), *_i("T", "N", "S"),
    ),
    "splitk_reduce_add": (
        _b("partial", "f32"), _b("out", "f32", "inout"), *_i("T", "N", "S"),
    ),
    "slot_gather": (_b("src", "i32"), _b("slot", "i32"), _b("out", "i32", "out"), *_i("R", "S")),
    "slot_scatter": (
        _b("values", "i32"), _b("slot", "i32"), _b("decision", "i32"),
        _b("dst", "i32", "inout"), *_i("R", "S"),
    ),
    "sample": (
        _b("logits", "f32"), _b("slot", "i32"), _b("positions", "i32"),
        _b("sampling_decision", "i32"), _b("seed", "u32"), _b("temperature", "f32"),
        _b("top_p", "f32"), _b("top_k", "i32"), _b("min_p", "f32"), _b("presence", "f32"),
        _b("frequency", "f32"), _b("repetition", "f32"), _b("histogram", "i32", "inout"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("sampled", "i32", "out"),
        *_i("R", "V", "W32"),
    ),
    "linear_invariant": (
        _b("x", "f32"), _b("weight", "f32"), _b("out", "f32", "out"), *_i("T", "N", "K"),
    ),
    "spec_draft_inputs": (
        _b("pending", "i32"), _b("slot", "i32"), _b("lane_start", "i32"),
        _b("query_length", "i32"), _b("drafts", "i32"), _b("tok", "i32", "out"),
        _b("pos", "i32", "out"), _b("row", "i32", "out"), _b("lane_slot", "i32", "out"),
        *_i("B", "S", "DMAX", "STEP"),
    ),
    "draft_sample": (
        _b("logits", "f32"), _b("lane_slot", "i32"), _b("pos", "i32"), _b("vocab_map", "i32"),
        _b("seed", "u32"), _b("temperature", "f32"), _b("top_p", "f32"), _b("top_k", "i32"),
        _b("min_p", "f32"), _b("drafts", "i32", "inout"), _b("q", "f32", "inout"),
        *_i("B", "VD", "V", "DMAX", "STEP"),
    ),
    "spec_pack_tokens": (
        _b("pending", "i32"), _b("slot", "i32"), _b("lane_start", "i32"), _b("drafts", "i32"),
        _b("positions", "i32"), _b("token_row", "i32"), _b("tokens", "i32", "out"),
        *_i("B", "P", "S", "DMAX"),
    ),
    "spec_verify": (
        _b("logits", "f32"), _b("slot", "i32"), _b("generation", "i32"),
        _b("lane_start", "i32"), _b("query_length", "i32"), _b("sampling_decision", "i32"),
        _b("seed", "u32"), _b("temperature", "f32"), _b("top_p", "f32"), _b("top_k", "i32"),
        _b("min_p", "f32"), _b("presence", "f32"), _b("frequency", "f32"),
        _b("repetition", "f32"), _b("histogram", "i32", "inout"), _b("grammar_mask", "i32"),
        _b("use_mask", "i32"), _b("drafts", "i32"), _b("q", "f32"), _b("vocab_map", "i32"),
        _b("token_row", "i32"), _b("pending", "i32", "inout"), _b("commit_row", "i32", "out"),
        _b("record", "i32", "out"),
        *_i("B", "P", "V", "VD", "W32", "DMAX", "W", "LAG"),
    ),
    "spec_copy_candidates": (
        _b("cand_ids", "i32"), _b("cand_count", "i32"), _b("cand_generation", "i32"),
        _b("cand_endpoint", "i32"), _b("generation", "i32"), _b("lane_start", "i32"),
        _b("query_length", "i32"), _b("lane_slot", "i32"), _b("drafts", "i32", "inout"),
        _b("q", "f32", "inout"), *_i("B", "CMAX", "DMAX", "V", "STEP"),
    ),
    "spec_candidate_masks": (
        _b("logits", "f32", "inout"), _b("token_row", "i32"), _b("positions", "i32"),
        _b("slot", "i32"), _b("lane_start", "i32"), _b("query_length", "i32"),
        _b("use_mask", "i32"), _b("cand_masks", "i32"), _b("cand_count", "i32"),
        _b("cand_generation", "i32"), _b("cand_endpoint", "i32"), _b("generation", "i32"),
        _b("drafts", "i32", "inout"), *_i("P", "B", "V", "W32", "CMAX", "DMAX"),
    ),
    # Coupled verification (new cores; the three ops above stay for cores exported
    # before it: draft_sample, spec_verify, spec_copy_candidates).
    "draft_sample_coupled": (
        _b("logits", "f32"), _b("lane_slot", "i32"), _b("pos", "i32"), _b("vocab_map", "i32"),
        _b("seed", "u32"), _b("temperature", "f32"), _b("top_p", "f32"), _b("top_k", "i32"),
        _b("min_p", "f32"), _b("drafts", "i32", "inout"), *_i("B", "VD", "DMAX", "STEP"),
    ),
    "spec_verify_coupled": (
        _b("logits", "f32"), _b("slot", "i32"), _b("generation", "i32"),
        _b("lane_start", "i32"), _b("query_length", "i32"), _b("sampling_decision", "i32"),
        _b("seed", "u32"), _b("temperature", "f32"), _b("top_p", "f32"), _b("top_k", "i32"),
        _b("min_p", "f32"), _b("presence", "f32"), _b("frequency", "f32"),
        _b("repetition", "f32"), _b("histogram", "i32", "inout"), _b("grammar_mask", "i32"),
        _b("use_mask", "i32"), _b("drafts", "i32"), _b("token_row", "i32"),
        _b("pending", "i32", "inout"), _b("commit_row", "i32", "out"),
        _b("record", "i32", "out"), *_i("B", "P", "V", "W32", "DMAX", "W", "LAG"),
    ),
    "spec_copy_drafts": (
        _b("cand_ids", "i32"), _b("cand_count", "i32"), _b("cand_generation", "i32"),
        _b("cand_endpoint", "i32"), _b("generation", "i32"), _b("lane_start", "i32"),
        _b("query_length", "i32"), _b("lane_slot", "i32"), _b("drafts", "i32", "inout"),
        *_i("B", "CMAX", "DMAX", "V", "STEP"),
    ),
    "spec_confidence": (
        _b("logits", "f32"), _b("lane_slot", "i32"), _b("drafts", "i32"),
        _b("vocab_map", "i32"), _b("confidence", "f32", "inout"),
        *_i("B", "VD", "DMAX", "STEP"),
    ),
    "spec_allocate": (
        _b("ceiling", "i32"), _b("slot", "i32"), _b("confidence", "f32"),
        _b("query_length", "i32", "out"), *_i("B", "P", "DMAX"),
    ),
    "spec_pack_rows": (
        _b("query_length", "i32"), _b("lane_start", "i32"), _b("slot", "i32"),
        _b("positions", "i32", "out"), _b("token_row", "i32", "out"),
        _b("token_slot", "i32", "out"), *_i("B", "P"),
    ),
    "paged_row_write": (
        _b("x", "f32"), _b("positions", "i32"), _b("token_row", "i32"), _b("slot", "i32"),
        _b("page_table", "i32"), _b("plane", "f32", "inout"), *_i("T", "R", "MP", "PT", "D"),
    ),
    "paged_row_gather_prev": (
        _b("plane", "f32"), _b("positions", "i32"), _b("token_row", "i32"), _b("slot", "i32"),
        _b("page_table", "i32"), _b("out", "f32", "out"), *_i("T", "R", "MP", "PT", "D"),
    ),
    "sample_biased": (
        _b("logits", "f32"), _b("slot", "i32"), _b("positions", "i32"),
        _b("sampling_decision", "i32"), _b("seed", "u32"), _b("temperature", "f32"),
        _b("top_p", "f32"), _b("top_k", "i32"), _b("min_p", "f32"), _b("presence", "f32"),
        _b("frequency", "f32"), _b("repetition", "f32"), _b("histogram", "i32", "inout"),
        _b("logit_bias", "f32"), _b("use_bias", "i32"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("sampled", "i32", "out"),
        *_i("R", "V", "W32"),
    ),
    "token_logprobs": (
        _b("logits", "f32"), _b("slot", "i32"), _b("sampled", "i32"),
        _b("logprobs_k", "i32"), _b("logprobs", "f32", "out"), _b("top_ids", "i32", "out"),
        *_i("R", "V", "K"),
    ),
    "score_tokens": (
        _b("logits", "f32"), _b("targets", "i32"), _b("scores", "f32", "out"),
        _b("score_ids", "i32", "out"), *_i("T", "V", "K"),
    ),
    "sample_chunks": (
        _b("logits", "f32"), _b("slot", "i32"), _b("temperature", "f32"), _b("top_k", "i32"),
        _b("presence", "f32"), _b("frequency", "f32"), _b("repetition", "f32"),
        _b("histogram", "i32"), _b("logit_bias", "f32"), _b("use_bias", "i32"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("chunk_max", "f32", "out"),
        _b("chunk_arg", "i32", "out"), _b("cand_key", "i32", "out"),
        _b("cand_id", "i32", "out"), *_i("R", "V", "W32", "C", "KM"),
    ),
    "sample_merge": (
        _b("chunk_max", "f32"), _b("chunk_arg", "i32"), _b("cand_key", "i32"),
        _b("cand_id", "i32"), _b("slot", "i32"), _b("positions", "i32"),
        _b("sampling_decision", "i32"), _b("seed", "u32"), _b("temperature", "f32"),
        _b("top_p", "f32"), _b("top_k", "i32"), _b("min_p", "f32"),
        _b("histogram", "i32", "inout"), _b("selected", "i32", "out"),
        _b("sampled", "i32", "out"), *_i("R", "V", "P", "KM"),
    ),
    "sample_chunks_nucleus": (
        _b("logits", "f32"), _b("slot", "i32"), _b("temperature", "f32"), _b("top_p", "f32"),
        _b("top_k", "i32"), _b("presence", "f32"), _b("frequency", "f32"),
        _b("repetition", "f32"), _b("histogram", "i32"), _b("logit_bias", "f32"),
        _b("use_bias", "i32"), _b("grammar_mask", "i32"), _b("use_mask", "i32"),
        _b("chunk_max", "f32", "out"), _b("chunk_arg", "i32", "out"),
        _b("chunk_mass", "f32", "out"), _b("cand_key", "i32", "out"),
        _b("cand_id", "i32", "out"), *_i("R", "V", "W32", "C", "KM"),
    ),
    "sample_merge_nucleus": (
        _b("chunk_max", "f32"), _b("chunk_arg", "i32"), _b("chunk_mass", "f32"),
        _b("cand_key", "i32"), _b("cand_id", "i32"), _b("slot", "i32"),
        _b("positions", "i32"), _b("sampling_decision", "i32"), _b("seed", "u32"),
        _b("temperature", "f32"), _b("top_p", "f32"), _b("top_k", "i32"),
        _b("min_p", "f32"), _b("histogram", "i32", "inout"), _b("selected", "i32", "out"),
        _b("sampled", "i32", "out"), *_i("R", "V", "P", "C", "KM", "KN"),
    ),
    "sample_chunks_wide": (
        _b("logits", "f32"), _b("slot", "i32"), _b("temperature", "f32"), _b("top_p", "f32"),
        _b("top_k", "i32"), _b("presence", "f32"), _b("frequency", "f32"),
        _b("repetition", "f32"), _b("histogram", "i32"), _b("logit_bias", "f32"),
        _b("use_bias", "i32"), _b("grammar_mask", "i32"), _b("use_mask", "i32"),
        _b("chunk_max", "f32", "out"), _b("chunk_arg", "i32", "out"),
        _b("chunk_mass", "f32", "out"), _b("cand_key", "i32", "out"),
        _b("cand_id", "i32", "out"), *_i("R", "V", "W32", "C", "KM"),
    ),
    "sample_race": (
        _b("logits", "f32"), _b("slot", "i32"), _b("positions", "i32"), _b("seed", "u32"),
        _b("temperature", "f32"), _b("top_k", "i32"), _b("min_p", "f32"),
        _b("presence", "f32"), _b("frequency", "f32"), _b("repetition", "f32"),
        _b("histogram", "i32"), _b("logit_bias", "f32"), _b("use_bias", "i32"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("chunk_max", "f32"),
        _b("chunk_mass", "f32"), _b("sampled", "i32"), _b("race_level", "i32", "inout"),
        _b("race_mass", "f32", "out"), _b("race_best", "i32", "out"),
        _b("race_arg", "i32", "out"), *_i("R", "V", "W32", "C", "NB", "LEVEL"),
    ),
    "sample_pick": (
        _b("race_mass", "f32"), _b("race_best", "i32"), _b("race_arg", "i32"),
        _b("slot", "i32"), _b("sampling_decision", "i32"), _b("temperature", "f32"),
        _b("top_p", "f32"), _b("top_k", "i32"), _b("histogram", "i32", "inout"),
        _b("race_level", "i32", "inout"), _b("sampled", "i32", "inout"),
        *_i("R", "V", "P", "NB", "LEVEL"),
    ),
    "sample_chunks_mass": (
        _b("logits", "f32"), _b("slot", "i32"), _b("temperature", "f32"), _b("top_k", "i32"),
        _b("presence", "f32"), _b("frequency", "f32"), _b("repetition", "f32"),
        _b("histogram", "i32"), _b("logit_bias", "f32"), _b("use_bias", "i32"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("chunk_max", "f32", "out"),
        _b("chunk_arg", "i32", "out"), _b("chunk_mass", "f32", "out"),
        _b("cand_key", "i32", "out"), _b("cand_id", "i32", "out"),
        *_i("R", "V", "W32", "C", "KM"),
    ),
    "sample_race_top": (
        _b("logits", "f32"), _b("slot", "i32"), _b("positions", "i32"), _b("seed", "u32"),
        _b("temperature", "f32"), _b("top_k", "i32"), _b("min_p", "f32"),
        _b("presence", "f32"), _b("frequency", "f32"), _b("repetition", "f32"),
        _b("histogram", "i32"), _b("logit_bias", "f32"), _b("use_bias", "i32"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("chunk_max", "f32"),
        _b("chunk_mass", "f32"), _b("sampled", "i32"), _b("top_score", "i32", "out"),
        _b("top_id", "i32", "out"), _b("top_zt", "f32", "out"),
        *_i("R", "V", "W32", "C", "M"),
    ),
    "sample_race_mass": (
        _b("logits", "f32"), _b("slot", "i32"), _b("temperature", "f32"), _b("top_p", "f32"),
        _b("top_k", "i32"), _b("min_p", "f32"), _b("presence", "f32"),
        _b("frequency", "f32"), _b("repetition", "f32"), _b("histogram", "i32"),
        _b("logit_bias", "f32"), _b("use_bias", "i32"), _b("grammar_mask", "i32"),
        _b("use_mask", "i32"), _b("chunk_max", "f32"), _b("chunk_mass", "f32"),
        _b("sampled", "i32"), _b("top_score", "i32"), _b("top_id", "i32"),
        _b("top_zt", "f32"), _b("ahead", "f32", "out"), *_i("R", "V", "W32", "C", "M"),
    ),
    "sample_race_pick": (
        _b("logits", "f32"), _b("slot", "i32"), _b("positions", "i32"),
        _b("sampling_decision", "i32"), _b("seed", "u32"), _b("temperature", "f32"),
        _b("top_p", "f32"), _b("top_k", "i32"), _b("min_p", "f32"), _b("presence", "f32"),
        _b("frequency", "f32"), _b("repetition", "f32"), _b("histogram", "i32", "inout"),
        _b("logit_bias", "f32"), _b("use_bias", "i32"), _b("grammar_mask", "i32"),
        _b("use_mask", "i32"), _b("top_score", "i32"), _b("top_id", "i32"),
        _b("top_zt", "f32"), _b("ahead", "f32"), _b("sampled", "i32", "inout"),
        *_i("R", "V", "W32", "P", "M"),
    ),
    "sample_rest": (
        _b("logits", "f32"), _b("slot", "i32"), _b("positions", "i32"),
        _b("sampling_decision", "i32"), _b("seed", "u32"), _b("temperature", "f32"),
        _b("top_p", "f32"), _b("top_k", "i32"), _b("min_p", "f32"), _b("presence", "f32"),
        _b("frequency", "f32"), _b("repetition", "f32"), _b("histogram", "i32", "inout"),
        _b("logit_bias", "f32"), _b("use_bias", "i32"),
        _b("grammar_mask", "i32"), _b("use_mask", "i32"), _b("sampled", "i32", "inout"),
        *_i("R", "V", "W32"),
    ),
    # Collectives (kernels/collective.py): bound to the backend's rank peers, not to a
    # function of their arguments.
    "all_reduce_sum": (_b("x", "f32", "inout"), *_i("T", "N")),
    "all_gather_columns": (_b("x", "f32"), _b("out", "f32", "out"), *_i("T", "NL", "N")),
    "broadcast_rank0": (_b("x", "f32", "inout"), *_i("T", "N")),
    "row_copy": (
        _b("src", "f32"), _b("dst", "f32", "inout"), _b("src_rows", "i32"),
        _b("dst_rows", "i32"), *_i("R", "ROW"),
    ),
    # Vision encoder and connector (kernels/vision.py).
    "patchify": (
        _b("windows", "f32"), _b("count", "i32"), _b("out", "f32", "out"), *_i("W", "S", "P"),
    ),
    "position_add": (_b("x", "f32", "inout"), _b("positions", "f32"), *_i("T", "NP", "D")),
    "layernorm": (
        _b("x", "f32"), _b("weight", "f32"), _b("bias", "f32"), _b("out", "f32", "out"),
        *_i("T", "D"), *_f("eps"),
    ),
    "bias_add": (_b("x", "f32", "inout"), _b("bias", "f32"), *_i("T", "N")),
    "gelu_tanh": (_b("x", "f32"), _b("out", "f32", "out"), *_i("T", "N")),
    "window_attention": (
        _b("qkv", "f32"), _b("count", "i32"), _b("out", "f32", "out"),
        *_i("W", "NP", "H", "HD"), *_f("scale"),
    ),
    "pixel_shuffle": (_b("x", "f32"), _b("out", "f32", "out"), *_i("W", "G", "D", "R")),
    "image_merge": (
        _b("features", "f32"), _b("index", "i32"), _b("x", "f32", "inout"), *_i("T", "F", "D"),
    ),
}  # fmt: skip


def _kv_fp8_params(op: str) -> tuple[ParamSpec, ...]:
    """The e4m3-cache form of `op` (kernels/kv_fp8.py): its planes u8 codes, followed by
    their ``[KVH]`` f32 per-head scales (``row_copy``: its rows u8, no scales)."""
    out: list[ParamSpec] = []
    for p in KERNEL_PARAMS[op]:
        if p.name in ("k_cache", "v_cache", "src", "dst"):
            out.append(p._replace(dtype="u8"))
            if p.name == "v_cache":
                out += [_b("k_scale", "f32"), _b("v_scale", "f32")]
        else:
            out.append(p)
    return tuple(out)


KERNEL_PARAMS.update({form: _kv_fp8_params(op) for op, form in KV_FP8_FORMS.items()})


def _kv_bf16_params(op: str) -> tuple[ParamSpec, ...]:
    """The bf16-cache form of `op` (kernels/kv_bf16.py): its planes bf16, nothing added."""
    return tuple(p._replace(dtype="bf16") if p.name in BF16_PLANE_PARAMS else p
                 for p in KERNEL_PARAMS[op])


KERNEL_PARAMS.update({form: _kv_bf16_params(op) for op, form in KV_BF16_FORMS.items()})

REFERENCE_OPS: dict[str, Callable[..., None]] = {
    "embedding": embedding,
    "rmsnorm": rmsnorm,
    "add_rmsnorm": add_rmsnorm,
    "linear": linear,
    "qk_rmsnorm": qk_rmsnorm,
    "moe_route": moe_route,
    "moe_align": moe_align,
    "moe_gate_up": moe_gate_up,
    "moe_down": moe_down,
    "moe_sum": moe_sum,
    "rope": rope,
    "kv_write": kv_write,
    "attention_prefill": attention_prefill,
    "attention_decode": attention_decode,
    "attention_decode_split": attention_decode_split,
    "attention_decode_merge": attention_decode_merge,
    "attention_decode_fused": attention_decode_fused,
    "attention_decode_split_tuned": attention_decode_split_tuned,
    "attention_decode_merge_tuned": attention_decode_merge_tuned,
    "attention_prefill_window": attention_prefill_window,
    "attention_decode_window": attention_decode_window,
    "head_rmsnorm": head_rmsnorm,
    "gelu_mul": gelu_mul,
    "scale": scale,
    "timer_mark": timer_mark,
    "split_tuning_setup": split_tuning_setup,
    "split_tuning_select": split_tuning_select,
    "silu_mul": silu_mul,
    "add": add,
    "gather_last": gather_last,
    "rope_kv_write": rope_kv_write,
    "swiglu_linear": swiglu_linear,
    "rmsnorm_linear": rmsnorm_linear,
    "linear_add": linear_add,
    "swiglu_linear_add": swiglu_linear_add,
    "linear_fp8": linear_fp8,
    "linear_int4": linear_int4,
    "linear_add_int4": linear_add_int4,
    "rmsnorm_linear_int4": rmsnorm_linear_int4,
    "swiglu_linear_int4": swiglu_linear_int4,
    "swiglu_linear_add_int4": swiglu_linear_add_int4,
    "linear_int4_min": linear_int4_min,
    "linear_add_int4_min": linear_add_int4_min,
    "rmsnorm_linear_int4_min": rmsnorm_linear_int4_min,
    "swiglu_linear_int4_min": swiglu_linear_int4_min,
    "swiglu_linear_add_int4_min": swiglu_linear_add_int4_min,
    "linear_int8": linear_int8,
    "embedding_int8": embedding_int8,
    "linear_add_int8": linear_add_int8,
    "rmsnorm_linear_int8": rmsnorm_linear_int8,
    "swiglu_linear_int8": swiglu_linear_int8,
    "swiglu_linear_add_int8": swiglu_linear_add_int8,
    "linear_add_fp8": linear_add_fp8,
    "rmsnorm_linear_fp8": rmsnorm_linear_fp8,
    "swiglu_linear_fp8": swiglu_linear_fp8,
    "swiglu_linear_add_fp8": swiglu_linear_add_fp8,
    "split_bf16": split_bf16,
    "swiglu_split_bf16": swiglu_split_bf16,
    "round_bf16": round_bf16,
    "swiglu_round_bf16": swiglu_round_bf16,
    "linear_packed": linear_packed,
    "linear_partial": linear_partial,
    "linear_packed_rows": linear_packed_rows,
    "splitk_reduce": splitk_reduce,
    "splitk_reduce_add": splitk_reduce_add,
    "slot_gather": slot_gather,
    "slot_scatter": slot_scatter,
    "sample": sample,
    "linear_invariant": linear_invariant,
    "spec_draft_inputs": spec_draft_inputs,
    "draft_sample": draft_sample,
    "spec_pack_tokens": spec_pack_tokens,
    "spec_verify": spec_verify,
    "spec_copy_candidates": spec_copy_candidates,
    "spec_candidate_masks": spec_candidate_masks,
    "draft_sample_coupled": draft_sample_coupled,
    "spec_verify_coupled": spec_verify_coupled,
    "spec_copy_drafts": spec_copy_drafts,
    "spec_confidence": spec_confidence,
    "spec_allocate": spec_allocate,
    "spec_pack_rows": spec_pack_rows,
    "paged_row_write": paged_row_write,
    "paged_row_gather_prev": paged_row_gather_prev,
    "sample_biased": sample_biased,
    "token_logprobs": token_logprobs,
    "score_tokens": score_tokens,
    "sample_chunks": sample_chunks,
    "sample_merge": sample_merge,
    "sample_rest": sample_rest,
    "sample_chunks_mass": sample_chunks_mass,
    "sample_race_top": sample_race_top,
    "sample_race_mass": sample_race_mass,
    "sample_race_pick": sample_race_pick,
    "sample_chunks_nucleus": sample_chunks_nucleus,
    "sample_merge_nucleus": sample_merge_nucleus,
    "sample_chunks_wide": sample_chunks_wide,
    "sample_race": sample_race,
    "sample_pick": sample_pick,
    "row_copy": row_copy,
    # e4m3 KV cache forms (kernels/kv_fp8.py)
    "kv_write_fp8kv": kv_write_fp8kv,
    "rope_kv_write_fp8kv": rope_kv_write_fp8kv,
    "attention_prefill_fp8kv": attention_prefill_fp8kv,
    "attention_prefill_window_fp8kv": attention_prefill_window_fp8kv,
    "attention_decode_window_fp8kv": attention_decode_window_fp8kv,
    "attention_decode_split_fp8kv": attention_decode_split_fp8kv,
    "attention_decode_split_tuned_fp8kv": attention_decode_split_tuned_fp8kv,
    "attention_decode_fused_fp8kv": attention_decode_fused_fp8kv,
    "row_copy_fp8kv": row_copy,  # bytes: any dtype
    # bf16 KV cache forms (kernels/kv_bf16.py)
    "kv_write_bf16kv": kv_write_bf16kv,
    "rope_kv_write_bf16kv": rope_kv_write_bf16kv,
    "attention_prefill_bf16kv": attention_prefill_bf16kv,
    "attention_prefill_window_bf16kv": attention_prefill_window_bf16kv,
    "attention_decode_window_bf16kv": attention_decode_window_bf16kv,
    "attention_decode_split_bf16kv": attention_decode_split_bf16kv,
    "attention_decode_split_tuned_bf16kv": attention_decode_split_tuned_bf16kv,
    "attention_decode_fused_bf16kv": attention_decode_fused_bf16kv,
    "row_copy_bf16kv": row_copy,  # uint16 rows: any dtype
    "patchify": patchify,
    "position_add": position_add,
    "layernorm": layernorm,
    "bias_add": bias_add,
    "gelu_tanh": gelu_tanh,
    "window_attention": window_attention,
    "pixel_shuffle": pixel_shuffle,
    "image_merge": image_merge,
}


def kernel_params(op: str) -> tuple[ParamSpec, ...]:
    """The parameter list of ``op``.

    Raises:
        KeyError: for an unknown op, listing the known ones.
    """
    try:
        return KERNEL_PARAMS[op]
    except KeyError:
        raise KeyError(f"unknown kernel op {op!r}; known ops: {', '.join(KERNEL_PARAMS)}") from None


def reference_op(op: str) -> Callable[..., None]:
    """The NumPy reference implementation of ``op``.

    Raises:
        KeyError: for an unknown op, listing the known ones, or a collective op (its
            reference joins every rank's part: ``kernels.collective``).
    """
    kernel_params(op)
    if op in COLLECTIVE_OPS:
        raise KeyError(f"{op} is a collective: bind it to the backend's rank peers "
                       "(reference: helios_tools.kernels.collective)")
    return REFERENCE_OPS[op]


def check_launch(op: str, args: Sequence[Any]) -> None:
    """Check a launch's arguments against ``KERNEL_PARAMS[op]``.

    Buffers must be NumPy arrays of the declared dtype (or, for capture, any object with a
    ``dtype`` attribute that compares equal); ``i32`` scalars must be integers and ``f32``
    scalars real numbers.

    Raises:
        KeyError: for an unknown op.
        TypeError: on a wrong argument count, kind or dtype (names the parameter).
    """
    params = kernel_params(op)
    if len(args) != len(params):
        raise TypeError(f"{op}: expected {len(params)} arguments, got {len(args)}")
    for spec, arg in zip(params, args, strict=True):
        if spec.kind == "buffer":
            dtype = getattr(arg, "dtype", None)
            if dtype is None or np.dtype(dtype) != DTYPES[spec.dtype]:
                raise TypeError(f"{op}.{spec.name}: expected a {spec.dtype} buffer, got {dtype}")
        elif spec.kind == "i32":
            if isinstance(arg, bool) or not isinstance(arg, (int, np.integer)):
                raise TypeError(f"{op}.{spec.name}: expected an i32 scalar, got {arg!r}")
            if not -(2**31) <= int(arg) < 2**31:
                raise TypeError(f"{op}.{spec.name}: {arg} does not fit in i32")
        elif isinstance(arg, bool) or not isinstance(arg, (int, float, np.integer, np.floating)):
            raise TypeError(f"{op}.{spec.name}: expected an f32 scalar, got {arg!r}")


# The table and the implementations must name the same ops (collectives: collective.py).
assert REFERENCE_OPS.keys() | set(COLLECTIVE_OPS) == KERNEL_PARAMS.keys()
assert not REFERENCE_OPS.keys() & set(COLLECTIVE_OPS)
