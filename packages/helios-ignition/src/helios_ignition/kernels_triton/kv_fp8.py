"""Triton entry points of the e4m3 KV cache forms (``*_fp8kv``, helios_tools/kernels/
kv_fp8.py): the f32 ops' bodies (attention.py) over uint8 planes of e4m3 codes, with the
``[KVH]`` f32 per-head scales after the planes.

The bodies read and write the planes through ``_kv_load`` / ``_kv_store``: a key or
value is loaded as its byte, reinterpreted as ``tl.float8e4nv`` and widened to f32 in
registers, then multiplied by its head's scale (one f32 product, as the reference); a
write divides by the scale, clamps to +-448 and rounds to nearest even. Launch geometry
and constants are the f32 op's (capture/launch.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .attention import (
    _decode_rows,
    _fused_body,
    _kv_write_token,
    _prefill_block,
    _rope_token,
    _split_body,
    _split_tuned_body,
)
from .state import row_copy


@triton.jit
def kv_write_fp8kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                   v_scale, T, R, MP, PT, H, KVH, HD, BLOCK: tl.constexpr):
    """``kv_write`` into e4m3 planes; grid ``(T,)``."""
    t = tl.program_id(0).to(tl.int64)
    _kv_write_token(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                    v_scale, t, MP, PT, H, KVH, HD, BLOCK)


@triton.jit
def rope_kv_write_fp8kv(qkv, positions, inv_freq, token_row, slot, page_table, k_cache,
                        v_cache, k_scale, v_scale, T, R, MP, PT, H, KVH, HD,
                        BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK: tl.constexpr):
    """``rope_kv_write`` into e4m3 planes; grid ``(T,)`` (the barrier: attention.py's)."""
    t = tl.program_id(0).to(tl.int64)
    _rope_token(qkv, positions, inv_freq, t, H, KVH, HD, BLOCK_H, BLOCK_HALF)
    tl.debug_barrier()
    _kv_write_token(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                    v_scale, t, MP, PT, H, KVH, HD, BLOCK)


@triton.jit
def attention_prefill_fp8kv(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                            k_scale, v_scale, out, T, R, MP, PT, H, KVH, HD, scale,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr):
    """``attention_prefill`` over e4m3 planes; grid ``(cdiv(T, BLOCK_M), H)``."""
    _prefill_block(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                   v_scale, out, T, MP, PT, H, KVH, HD, 0, scale, BLOCK_M, BLOCK_N, BLOCK_HD,
                   BLOCK_G)


@triton.jit
def attention_prefill_window_fp8kv(qkv, positions, token_row, slot, page_table, k_cache,
                                   v_cache, k_scale, v_scale, out, T, R, MP, PT, H, KVH, HD,
                                   W, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                   BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr):
    """``attention_prefill_window`` over e4m3 planes; grid ``(cdiv(T, BLOCK_M), H)``."""
    _prefill_block(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_scale,
                   v_scale, out, T, MP, PT, H, KVH, HD, W, scale, BLOCK_M, BLOCK_N, BLOCK_HD,
                   BLOCK_G)


@triton.jit
def attention_decode_window_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                                  v_scale, out, B, MP, PT, H, KVH, HD, W, scale,
                                  BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr):
    """``attention_decode_window`` over e4m3 planes; grid ``(B, H)``."""
    _decode_rows(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, out,
                 MP, PT, H, KVH, HD, W, scale, BLOCK_N, BLOCK_HD)


@triton.jit
def attention_decode_split_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                                 v_scale, part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT,
                                 scale, BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr,
                                 BLOCK_G: tl.constexpr, GROUPED: tl.constexpr,
                                 EVEN_HD: tl.constexpr = 0, SPP: tl.constexpr = 1,
                                 LIVE: tl.constexpr = 0):
    """``attention_decode_split`` over e4m3 planes (every GROUPED layout, and the live-split
    layout LIVE > 0)."""
    _split_body(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N, BLOCK_HD, BLOCK_G,
                GROUPED, EVEN_HD, SPP, LIVE)


@triton.jit
def attention_decode_split_tuned_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache,
                                       k_scale, v_scale, part_ml, part_o, choice, B, MP, PT,
                                       H, KVH, HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                                       BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                                       GROUPED: tl.constexpr, EVEN_HD: tl.constexpr = 0):
    """``attention_decode_split_tuned`` over e4m3 planes."""
    _split_tuned_body(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale,
                      part_ml, part_o, choice, B, MP, PT, H, KVH, HD, NS, SPLIT, scale,
                      BLOCK_N, BLOCK_HD, BLOCK_G, GROUPED, EVEN_HD)


@triton.jit
def attention_decode_fused_fp8kv(qkv, positions, slot, page_table, k_cache, v_cache, k_scale,
                                 v_scale, part_ml, part_o, arrivals, out, B, MP, PT, H, KVH,
                                 HD, NS, SPLIT, scale, BLOCK_N: tl.constexpr,
                                 BLOCK_HD: tl.constexpr, BLOCK_G: tl.constexpr,
                                 BLOCK_S: tl.constexpr, EVEN_HD: tl.constexpr):
    """``attention_decode_fused`` over e4m3 planes; grid ``(B, KVH, NS)``."""
    _fused_body(qkv, positions, slot, page_table, k_cache, v_cache, k_scale, v_scale, part_ml,
                part_o, arrivals, out, B, MP, PT, H, KVH, HD, NS, SPLIT, scale, BLOCK_N,
                BLOCK_HD, BLOCK_G, BLOCK_S, EVEN_HD)


KV_FP8_TRITON = {
    "kv_write_fp8kv": kv_write_fp8kv,
    "rope_kv_write_fp8kv": rope_kv_write_fp8kv,
    "attention_prefill_fp8kv": attention_prefill_fp8kv,
    "attention_prefill_window_fp8kv": attention_prefill_window_fp8kv,
    "attention_decode_window_fp8kv": attention_decode_window_fp8kv,
    "attention_decode_split_fp8kv": attention_decode_split_fp8kv,
    "attention_decode_split_tuned_fp8kv": attention_decode_split_tuned_fp8kv,
    "attention_decode_fused_fp8kv": attention_decode_fused_fp8kv,
    "row_copy_fp8kv": row_copy,  # the byte rows of e4m3 planes (its body is dtype-free)
}
