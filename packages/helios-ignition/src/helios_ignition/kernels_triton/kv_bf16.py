"""Triton kernels of the bf16 KV cache forms (``*_bf16kv``, helios_tools/kernels/
kv_bf16.py): each form is its f32 op's own entry point, compiled with bf16 pointers for
the planes (the forms' parameters are the f32 op's, their planes of dtype ``bf16``:
kernels_aot.signature).

The bodies read and write the planes through ``_kv_load`` / ``_kv_store``
(kernels_triton/attention.py), which branch on the plane's element type: a bf16 key or
value is widened to f32 in registers (exact), and a write rounds the f32 value to nearest
even (``cvt.rn.bf16.f32``); the arithmetic between is the f32 op's. Launch geometry and
constants are the f32 op's (capture/launch.py).
"""

from __future__ import annotations

from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS

from .attention import (
    attention_decode_fused,
    attention_decode_split,
    attention_decode_split_tuned,
    attention_prefill,
    kv_write,
    rope_kv_write,
)
from .state import row_copy
from .window import attention_decode_window, attention_prefill_window

_F32_ENTRY = {
    "kv_write": kv_write,
    "rope_kv_write": rope_kv_write,
    "attention_prefill": attention_prefill,
    "attention_prefill_window": attention_prefill_window,
    "attention_decode_window": attention_decode_window,
    "attention_decode_split": attention_decode_split,
    "attention_decode_split_tuned": attention_decode_split_tuned,
    "attention_decode_fused": attention_decode_fused,
    "row_copy": row_copy,  # rows of 2-byte elements (its body is dtype-free)
}
KV_BF16_TRITON = {form: _F32_ENTRY[op] for op, form in KV_BF16_FORMS.items()}
