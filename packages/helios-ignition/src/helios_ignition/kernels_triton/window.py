"""Triton kernels of the ops a sliding-window family adds (Gemma 3): windowed paged
attention (prefill and decode), the per-head RMS norm of queries and keys, the GeGLU
activation and an in-place scale.

Same parameters and semantics as ``helios_tools.kernels`` (attention_prefill_window,
attention_decode_window, head_rmsnorm, gelu_mul, scale). The attention kernels are
thin entry points over ``attention.py``'s bodies (one body per attention with a window
parameter; W = 0 there): a query at position ``p`` sees positions
``max(0, p - W + 1)..p``, and no page-table entry wholly behind every query's window is
read (those pages may have been returned to the pool).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .attention import _decode_rows, _prefill_block


@triton.jit
def attention_decode_window(qkv, positions, slot, page_table, k_cache, v_cache, out,
                            B, MP, PT, H, KVH, HD, W, scale, BLOCK_N: tl.constexpr,
                            BLOCK_HD: tl.constexpr):
    """One query token per row over its cache positions ``max(0, p - W + 1)..p``; grid
    ``(B, H)``: ``attention_decode``'s body (attention.py) with the window."""
    _decode_rows(qkv, positions, slot, page_table, k_cache, v_cache, k_cache, v_cache, out,
                 MP, PT, H, KVH, HD, W, scale, BLOCK_N, BLOCK_HD)  # f32 planes: no scales


@triton.jit
def attention_prefill_window(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                             out, T, R, MP, PT, H, KVH, HD, W, scale, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr,
                             BLOCK_G: tl.constexpr, LANE_TERMS: tl.constexpr = 0,
                             EVEN_HD: tl.constexpr = 0):
    """Causal windowed GQA attention of a block of packed tokens for one query head; grid
    ``(cdiv(T, BLOCK_M) + min(R, T), H)``: ``attention_prefill``'s body (attention.py)
    with the window, masked to ``p - W < j <= p`` (LANE_TERMS as there)."""
    _prefill_block(qkv, positions, token_row, slot, page_table, k_cache, v_cache, k_cache,
                   v_cache, out, T, MP, PT, H, KVH, HD, W, scale, BLOCK_M, BLOCK_N,
                   BLOCK_HD, BLOCK_G, LANE_TERMS, EVEN_HD)  # f32 planes: no scales


@triton.jit
def head_rmsnorm(qkv, q_weight, k_weight, T, H, KVH, HD, eps, BLOCK_D: tl.constexpr):
    """RMS norm of one query or key head of one token, in place; grid ``(T, H + KVH)``
    (heads ``0..H-1`` read ``q_weight``, the rest ``k_weight``)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    md = d < HD
    ptr = qkv + t * ((H + 2 * KVH) * HD) + h * HD + d
    x = tl.load(ptr, mask=md, other=0.0)
    inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.sum(x * x, axis=0) / HD + eps))
    w = tl.where(h < H, tl.load(q_weight + d, mask=md, other=0.0),
                 tl.load(k_weight + d, mask=md, other=0.0))
    tl.store(ptr, x * inv * w, mask=md)


@triton.jit
def gelu_mul(gate_up, out, T, F, BLOCK: tl.constexpr):
    """``out[t, f] = gelu_tanh(gate_up[t, f]) * gate_up[t, F + f]``; grid
    ``(T, cdiv(F, BLOCK))``."""
    t = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = f < F
    g = tl.load(gate_up + t * 2 * F + f, mask=m, other=0.0)
    u = tl.load(gate_up + t * 2 * F + F + f, mask=m, other=0.0)
    c = 0.7978845608028654 * g * (1.0 + 0.044715 * g * g)  # sqrt(2 / pi)
    # 1 + tanh(c) = 2 - 2 / (exp(2c) + 1): exp overflowing to inf gives 2, underflowing 0
    tl.store(out + t * F + f, g * (1.0 - 1.0 / (libdevice.exp(2.0 * c) + 1.0)) * u, mask=m)


@triton.jit
def scale(x, T, D, factor, BLOCK: tl.constexpr):
    """``x *= factor`` over ``[T, D]``; grid ``(T, cdiv(D, BLOCK))``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = d < D
    tl.store(x + t * D + d, tl.load(x + t * D + d, mask=m, other=0.0) * factor, mask=m)
