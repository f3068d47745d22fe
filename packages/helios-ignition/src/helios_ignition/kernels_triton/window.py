"""Triton kernels of the ops a sliding-window family adds (Gemma 3): windowed paged
attention (prefill and decode), the per-head RMS norm of queries and keys, the GeGLU
activation and an in-place scale.

Same parameters and semantics as ``helios_tools.kernels`` (attention_prefill_window,
attention_decode_window, head_rmsnorm, gelu_mul, scale). The attention kernels are
``attention.py``'s with the window: a query at position ``p`` sees positions
``max(0, p - W + 1)..p``, and no page-table entry wholly behind every query's window is
read (those pages may have been returned to the pool).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity" for running maxima


@triton.jit
def attention_decode_window(qkv, positions, slot, page_table, k_cache, v_cache, out,
                            B, MP, PT, H, KVH, HD, W, scale, BLOCK_N: tl.constexpr,
                            BLOCK_HD: tl.constexpr):
    """One query token per row over its cache positions ``max(0, p - W + 1)..p``; grid
    ``(B, H)``. Online softmax over ``BLOCK_N``-position blocks, f32 throughout."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kvh = h // (H // KVH)
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    s = tl.load(slot + b)
    dst = out + b * (H * HD) + h * HD + d
    if s < 0:
        tl.store(dst, tl.zeros((BLOCK_HD,), tl.float32), mask=md)
    else:
        width = (H + 2 * KVH) * HD
        q = tl.load(qkv + b * width + h * HD + d, mask=md, other=0.0) * scale
        ctx = tl.load(positions + b) + 1
        lo = tl.maximum(ctx - W, 0)
        m_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0) + NEG_BIG
        l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
        acc = tl.zeros((BLOCK_HD,), tl.float32)
        row = page_table + s.to(tl.int64) * MP
        for j0 in range(lo, ctx, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            mj = j < ctx
            page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
            off = ((page * PT + j % PT) * KVH + kvh) * HD
            mkv = mj[:, None] & md[None, :]
            k = tl.load(k_cache + off[:, None] + d[None, :], mask=mkv, other=0.0)
            sc = tl.sum(q[None, :] * k, axis=1)
            sc = tl.where(mj, sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=0))
            alpha = libdevice.exp(m_i - m_new)
            p = libdevice.exp(sc - m_new)
            v = tl.load(v_cache + off[:, None] + d[None, :], mask=mkv, other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        tl.store(dst, acc / l_i, mask=md)


@triton.jit
def attention_prefill_window(qkv, positions, token_row, slot, page_table, k_cache, v_cache,
                             out, T, R, MP, PT, H, KVH, HD, W, scale, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_HD: tl.constexpr):
    """Causal windowed GQA attention of a block of packed tokens for one query head; grid
    ``(cdiv(T, BLOCK_M), H)``. As ``attention_prefill``, each row present in the block
    streams its cache positions from the first its earliest token still sees
    (``min position - W + 1``) to its latest, masked to ``p - W < j <= p``."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // (H // KVH)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = offs_m < T
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    trow = tl.load(token_row + offs_m, mask=mm, other=-1)
    srow = tl.load(slot + tl.maximum(trow, 0), mask=trow >= 0, other=-1)
    live = (trow >= 0) & (srow >= 0)
    pos = tl.load(positions + offs_m, mask=mm, other=0)
    width = (H + 2 * KVH) * HD
    q = tl.load(qkv + offs_m[:, None].to(tl.int64) * width + h * HD + d[None, :],
                mask=mm[:, None] & md[None, :], other=0.0) * scale
    m_i = tl.full((BLOCK_M,), NEG_BIG, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_HD), tl.float32)
    r_lo = tl.min(tl.where(live, trow, 2147483647), axis=0)
    r_hi = tl.max(tl.where(live, trow, -1), axis=0)
    for r in range(r_lo, r_hi + 1):
        mine = live & (trow == r)
        s = tl.max(tl.where(mine, srow, -1), axis=0)
        pmax = tl.max(tl.where(mine, pos, -1), axis=0)
        pmin = tl.min(tl.where(mine, pos, 2147483647), axis=0)
        lo = tl.maximum(pmin - W + 1, 0)
        row = page_table + tl.maximum(s, 0).to(tl.int64) * MP
        for j0 in range(lo, pmax + 1, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            mj = j <= pmax
            page = tl.load(row + j // PT, mask=mj, other=0).to(tl.int64)
            off = ((page * PT + j % PT) * KVH + kvh) * HD
            mkv = mj[:, None] & md[None, :]
            k = tl.load(k_cache + off[:, None] + d[None, :], mask=mkv, other=0.0)
            sc = tl.dot(q, tl.trans(k), input_precision="tf32x3")
            vis = (mine[:, None] & (j[None, :] <= pos[:, None])
                   & (j[None, :] > pos[:, None] - W) & mj[None, :])
            sc = tl.where(vis, sc, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = libdevice.exp(m_i - m_new)
            p = libdevice.exp(sc - m_new[:, None])
            v = tl.load(v_cache + off[:, None] + d[None, :], mask=mkv, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32x3")
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
    res = tl.where(live[:, None] & (l_i[:, None] > 0), acc / l_i[:, None], 0.0)
    dst = out + offs_m[:, None].to(tl.int64) * (H * HD) + h * HD + d[None, :]
    tl.store(dst, res, mask=mm[:, None] & md[None, :])


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
