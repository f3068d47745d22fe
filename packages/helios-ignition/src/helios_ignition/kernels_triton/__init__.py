"""Triton implementations of every kernel op in ``helios_tools.kernels``.

``TRITON_KERNELS[op]`` is the ``@triton.jit`` function of ``op``. Its leading parameters
are exactly ``KERNEL_PARAMS[op]`` (buffers, then scalars); the trailing ``tl.constexpr``
parameters are the variant constants chosen by ``capture.launch.launch_config`` (all of
them except ``WARPS``, which is the compile option ``num_warps``). Kernels are compiled
ahead of time by ``helios_ignition.kernels_aot``; nothing here launches anything.
"""

from __future__ import annotations

from . import vision
from .attention import (
    attention_decode,
    attention_decode_fused,
    attention_decode_merge,
    attention_decode_merge_tuned,
    attention_decode_split,
    attention_decode_split_tuned,
    attention_prefill,
    kv_write,
    rope,
    rope_kv_write,
)
from .dense import (
    add,
    add_rmsnorm,
    embedding,
    gather_last,
    linear,
    rmsnorm,
    rmsnorm_linear,
    silu_mul,
)
from .experts import moe_align, moe_down, moe_gate_up, moe_route, moe_sum, qk_rmsnorm
from .fp8 import FP8_TRITON
from .int4 import INT4_TRITON
from .int8 import INT8_TRITON
from .invariant import linear_rows
from .kv_bf16 import KV_BF16_TRITON
from .kv_fp8 import KV_FP8_TRITON
from .mma import linear_splitk, split_bf16, splitk_reduce
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
from .state import row_copy, slot_gather, slot_scatter
from .tuning import split_tuning_select, split_tuning_setup, timer_mark
from .window import (
    attention_decode_window,
    attention_prefill_window,
    gelu_mul,
    head_rmsnorm,
    scale,
)

TRITON_KERNELS = {
    # FP8 W8A8 products (kernels_triton/fp8.py)
    **FP8_TRITON,
    **INT4_TRITON,  # W4A16 products (kernels_triton/int4.py)
    **KV_FP8_TRITON,  # e4m3 KV cache forms (kernels_triton/kv_fp8.py)
    **KV_BF16_TRITON,  # bf16 KV cache forms (kernels_triton/kv_bf16.py)
    **INT8_TRITON,  # W8A16 products of repacked GGUF weights (kernels_triton/int8.py)
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
    "timer_mark": timer_mark,
    "split_tuning_setup": split_tuning_setup,
    "split_tuning_select": split_tuning_select,
    "silu_mul": silu_mul,
    "add": add,
    "gather_last": gather_last,
    "rope_kv_write": rope_kv_write,
    "swiglu_linear": linear,  # the linear kernel with SWIGLU=1 (see launch_config)
    "rmsnorm_linear": rmsnorm_linear,  # the linear body with its RMS prologue
    "linear_add": linear,  # the linear kernel with ACC=1 (residual add in the epilogue)
    "swiglu_linear_add": linear,  # SWIGLU=1 and ACC=1
    "slot_gather": slot_gather,
    "slot_scatter": slot_scatter,
    "sample": sample,
    "linear_invariant": linear_rows,  # one binary per matrix for every row count
    "spec_draft_inputs": spec_draft_inputs,
    "draft_sample": draft_sample,
    "draft_sample_coupled": draft_sample_coupled,
    "spec_verify_coupled": spec_verify_coupled,
    "spec_copy_drafts": spec_copy_drafts,
    "spec_pack_tokens": spec_pack_tokens,
    "spec_verify": spec_verify,
    "spec_copy_candidates": spec_copy_candidates,
    "spec_candidate_masks": spec_candidate_masks,
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
    "sample_chunks_nucleus": sample_chunks_nucleus,
    "sample_merge_nucleus": sample_merge_nucleus,
    "sample_chunks_wide": sample_chunks_wide,
    "sample_race": sample_race,
    "sample_pick": sample_pick,
    "sample_chunks_mass": sample_chunks_mass,
    "sample_race_top": sample_race_top,
    "sample_race_mass": sample_race_mass,
    "sample_race_pick": sample_race_pick,
    "row_copy": row_copy,
    "split_bf16": split_bf16,
    "swiglu_split_bf16": split_bf16,  # SWIGLU=1 (see launch_config)
    "round_bf16": split_bf16,  # LO=0: hi | 0 (bf16 activations)
    "swiglu_round_bf16": split_bf16,  # SWIGLU=1, LO=0
    "linear_packed": linear_splitk,  # PACKED=1
    "linear_partial": linear_splitk,  # PACKED=0
    "linear_packed_rows": linear_splitk,  # PACKED=1, one tile per matrix at every row count
    "splitk_reduce": splitk_reduce,
    "splitk_reduce_add": splitk_reduce,  # ACC=1
    "attention_prefill_window": attention_prefill_window,
    "attention_decode_window": attention_decode_window,
    "head_rmsnorm": head_rmsnorm,
    "gelu_mul": gelu_mul,
    "scale": scale,
    # vision tower and connector (kernels_triton/vision.py)
    "patchify": vision.patchify,
    "position_add": vision.position_add,
    "layernorm": vision.layernorm,
    "bias_add": vision.bias_add,
    "gelu_tanh": vision.gelu_tanh,
    "window_attention": vision.window_attention,
    "pixel_shuffle": vision.pixel_shuffle,
    "image_merge": vision.image_merge,
}

# Buffer parameters whose element type follows the variant constant WBF16.
WEIGHT_PARAMS = {"linear": "weight", "linear_invariant": "weight", "swiglu_linear": "weight",
                 "rmsnorm_linear": "weight", "linear_add": "weight",
                 "swiglu_linear_add": "weight", "embedding": "table",
                 "linear_packed": "weight", "linear_partial": "weight",
                 "linear_packed_rows": "weight",
                 "moe_gate_up": "w_gate_up", "moe_down": "w_down",
                 "position_add": "positions"}

__all__ = ["TRITON_KERNELS", "WEIGHT_PARAMS"]
