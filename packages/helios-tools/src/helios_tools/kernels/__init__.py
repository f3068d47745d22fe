"""NumPy reference kernels: the CPU backend's ops and the oracle for the GPU kernels.

Every op writes its outputs in place and takes arrays first, then scalars, exactly as the
GPU kernel of the same name (see ``KERNEL_PARAMS``). Activations and caches are float32;
index buffers are int32; a token with ``token_row < 0`` or a row with ``slot < 0`` is
padding and writes no cache, histogram or completion.
"""

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
    tuned_split_length,
)
from .cache import kv_write, row_copy
from .elementwise import add, gelu_mul, scale, silu_mul
from .embedding import embedding, gather_last
from .experts import moe_align, moe_blocks, moe_down, moe_gate_up, moe_route, moe_sum
from .fused import (
    linear_add,
    rmsnorm_linear,
    rope_kv_write,
    swiglu_linear,
    swiglu_linear_add,
)
from .linear import linear, linear_invariant
from .linear_splitk import (
    linear_packed,
    linear_packed_rows,
    linear_partial,
    split_bf16,
    splitk_reduce,
    splitk_reduce_add,
    swiglu_split_bf16,
)
from .norm import add_rmsnorm, head_rmsnorm, qk_rmsnorm, rmsnorm
from .pending import slot_gather, slot_scatter
from .registry import (
    DTYPES,
    KERNEL_PARAMS,
    REFERENCE_OPS,
    ParamSpec,
    check_launch,
    kernel_params,
    reference_op,
)
from .rng import philox4x32_10, philox_uniform
from .rope import rope
from .sampling import grammar_mask_words, sample, sample_biased, score_tokens, token_logprobs
from .sampling_chunks import (
    sample_chunks,
    sample_chunks_nucleus,
    sample_chunks_wide,
    sample_merge,
    sample_merge_nucleus,
    sample_pick,
    sample_race,
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

__all__ = [
    "DTYPES",
    "KERNEL_PARAMS",
    "ParamSpec",
    "REFERENCE_OPS",
    "add",
    "add_rmsnorm",
    "attention_decode",
    "attention_decode_fused",
    "attention_decode_merge",
    "attention_decode_merge_tuned",
    "attention_decode_split",
    "attention_decode_split_tuned",
    "attention_decode_window",
    "attention_prefill",
    "attention_prefill_window",
    "check_launch",
    "draft_sample",
    "draft_sample_coupled",
    "embedding",
    "gather_last",
    "gelu_mul",
    "grammar_mask_words",
    "head_rmsnorm",
    "kernel_params",
    "kv_write",
    "linear",
    "linear_add",
    "linear_invariant",
    "linear_packed",
    "linear_packed_rows",
    "linear_partial",
    "paged_row_gather_prev",
    "paged_row_write",
    "philox4x32_10",
    "philox_uniform",
    "reference_op",
    "rmsnorm",
    "qk_rmsnorm",
    "moe_align",
    "moe_blocks",
    "moe_down",
    "moe_gate_up",
    "moe_route",
    "moe_sum",
    "rmsnorm_linear",
    "rope",
    "rope_kv_write",
    "row_copy",
    "patchify",
    "position_add",
    "layernorm",
    "bias_add",
    "gelu_tanh",
    "window_attention",
    "pixel_shuffle",
    "image_merge",
    "sample",
    "sample_biased",
    "sample_chunks",
    "sample_chunks_nucleus",
    "sample_chunks_wide",
    "sample_merge",
    "sample_merge_nucleus",
    "sample_pick",
    "sample_race",
    "sample_rest",
    "scale",
    "silu_mul",
    "slot_gather",
    "slot_scatter",
    "spec_allocate",
    "spec_candidate_masks",
    "spec_confidence",
    "spec_copy_candidates",
    "spec_copy_drafts",
    "spec_draft_inputs",
    "spec_pack_rows",
    "spec_pack_tokens",
    "spec_verify",
    "spec_verify_coupled",
    "split_bf16",
    "split_tuning_select",
    "split_tuning_setup",
    "score_tokens",
    "splitk_reduce",
    "splitk_reduce_add",
    "swiglu_linear",
    "swiglu_linear_add",
    "swiglu_split_bf16",
    "timer_mark",
    "token_logprobs",
    "tuned_split_length",
]
