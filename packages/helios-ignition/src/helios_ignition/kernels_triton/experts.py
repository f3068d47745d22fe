"""Triton kernels for QK-norm and the mixture-of-experts ops (helios_tools.kernels.norm
``qk_rmsnorm`` and helios_tools.kernels.experts, whose docstrings give the reference loops).

The experts run as grouped matrix products: ``moe_align`` (one program) lists each
expert's (token, expert) pairs in blocks of BLOCK_T rows; ``moe_gate_up`` and ``moe_down``
run one program per (block, N tile), loading the block's expert weight tile once for its
BLOCK_T rows (a tensor-core ``tl.dot``; bf16 weights against the f32 activations split
into two bf16 terms, as the dense linear's XSPLIT path), and return at once for an unused
block; ``moe_sum`` adds each token's K pair rows in order. Nothing uses atomics, so every
result is deterministic. Block rows beyond a block's pairs (-1) load zeros and store
nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def qk_rmsnorm(qkv, q_weight, k_weight, T, H, KVH, HD, eps, BLOCK_HD: tl.constexpr):
    """RMS norm of query or key head ``program_id(1)`` of token row ``program_id(0)``, in
    place; grid ``(T, H + KVH)``."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_HD)
    md = d < HD
    ptr = qkv + t * ((H + 2 * KVH) * HD) + h * HD + d
    x = tl.load(ptr, mask=md, other=0.0)
    g = tl.load(q_weight + d, mask=md & (h < H), other=0.0) + \
        tl.load(k_weight + d, mask=md & (h >= H), other=0.0)
    inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.sum(x * x, axis=0) / HD + eps))
    tl.store(ptr, x * inv * g, mask=md)


@triton.jit
def moe_route(logits, ids, weights, T, E, K, NORM, BLOCK_E: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """Softmax over token row ``program_id(0)``'s E logits, its K largest probabilities
    (ties: the lower expert first), renormalized when NORM; grid ``(T,)``."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    me = e < E
    z = tl.load(logits + t * E + e, mask=me, other=-float("inf"))
    p = tl.exp(z - tl.max(z, axis=0))
    p = tl.where(me, p, 0.0)
    p = p / tl.sum(p, axis=0)
    left = tl.where(me, p, -1.0)  # taken experts drop to -1
    kk = tl.arange(0, BLOCK_K)
    top_w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for k in range(K):
        best = tl.max(left, axis=0)
        pick = tl.min(tl.where(left == best, e, BLOCK_E), axis=0)
        top_w = tl.where(kk == k, best, top_w)
        top_i = tl.where(kk == k, pick, top_i)
        left = tl.where(e == pick, -1.0, left)
    if NORM:
        top_w = top_w / tl.sum(top_w, axis=0)
    mk = kk < K
    tl.store(ids + t * K + kk, top_i, mask=mk)
    tl.store(weights + t * K + kk, top_w, mask=mk)


@triton.jit
def moe_align(ids, sorted_pairs, block_expert, T, E, K, BT, NB, BLOCK_P: tl.constexpr,
              BLOCK_T: tl.constexpr):
    """Counting sort of the T K pairs by expert into blocks of BLOCK_T (= BT) rows, each
    expert's pairs in ascending order and its last block padded with -1; unused blocks
    get expert -1. One program; every element is written exactly once (no barrier)."""
    p = tl.arange(0, BLOCK_P)
    mp = p < T * K
    owner = tl.load(ids + p, mask=mp, other=-1)
    pad = tl.arange(0, BLOCK_T)
    at = 0
    for e in range(E):
        mine = (owner == e) & mp
        count = tl.sum(mine.to(tl.int32), axis=0)
        pos = tl.cumsum(mine.to(tl.int32), axis=0) - 1
        tl.store(sorted_pairs + at + pos, p, mask=mine)
        padded = (count + BLOCK_T - 1) // BLOCK_T * BLOCK_T
        tl.store(sorted_pairs + at + count + pad, -1, mask=pad < padded - count)
        for j in range(padded // BLOCK_T):
            tl.store(block_expert + at // BLOCK_T + j, e)
        at += padded
    for start in range(at, NB * BLOCK_T, BLOCK_P):
        tl.store(sorted_pairs + start + p, -1, mask=start + p < NB * BLOCK_T)
    for b in range(at // BLOCK_T, NB):
        tl.store(block_expert + b, -1)


@triton.jit
def _block_product(a_rows, ma, w_rows, mn, Kd, acc, BLOCK_K: tl.constexpr,
                   WBF16: tl.constexpr):
    """``acc += a @ w^T`` over Kd: `a_rows` [BLOCK_T, 1] activation row pointers (`ma`
    live rows), `w_rows` [BLOCK_N, 1] weight row pointers (`mn` live rows)."""
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, Kd, BLOCK_K):
        kk = k0 + offs_k
        mk = (kk < Kd)[None, :]
        a = tl.load(a_rows + kk[None, :], mask=ma[:, None] & mk, other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk, other=0.0)
        wt = tl.trans(w)
        if WBF16:  # a = hi + lo in bf16 terms: near-f32 products on the tensor cores
            hi = a.to(tl.bfloat16)
            acc = tl.dot(hi, wt, acc)
            acc = tl.dot((a - hi.to(tl.float32)).to(tl.bfloat16), wt, acc)
        else:
            acc = tl.dot(a, wt, acc, input_precision="ieee")
    return acc


@triton.jit
def moe_gate_up(x, sorted_pairs, block_expert, w_gate_up, act, T, D, F, K, BT, NB,
                BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                WBF16: tl.constexpr):
    """``act[p, n] = silu(gate) * up`` for the pairs of block ``program_id(0)`` and
    expert columns ``n`` of tile ``program_id(1)``; grid ``(NB, cdiv(F, BLOCK_N))``."""
    b = tl.program_id(0)
    e = tl.load(block_expert + b)
    if e >= 0:
        rows = tl.load(sorted_pairs + b * BLOCK_T + tl.arange(0, BLOCK_T))
        live = rows >= 0
        tok = tl.where(live, rows // K, 0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mn = n < F
        expert = w_gate_up + e.to(tl.int64) * (2 * F) * D
        a_rows = x + tok[:, None] * D
        gate = _block_product(a_rows, live, expert + n[:, None].to(tl.int64) * D, mn, D,
                              tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32), BLOCK_K, WBF16)
        up = _block_product(a_rows, live, expert + (F + n[:, None]).to(tl.int64) * D, mn, D,
                            tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32), BLOCK_K, WBF16)
        silu = tl.math.div_rn(gate, 1.0 + tl.exp(-gate))  # silu_mul's arithmetic
        dst = act + tl.where(live, rows, 0)[:, None].to(tl.int64) * F + n[None, :]
        tl.store(dst, silu * up, mask=live[:, None] & mn[None, :])


@triton.jit
def moe_down(act, sorted_pairs, block_expert, w_down, weights, pair_out, T, D, F, K, BT, NB,
             BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             WBF16: tl.constexpr):
    """``pair_out[p, n] = weights.flat[p] * (act[p] @ w_down[e]^T)[n]`` for the pairs of
    block ``program_id(0)``, hidden columns of tile ``program_id(1)``; grid
    ``(NB, cdiv(D, BLOCK_N))``."""
    b = tl.program_id(0)
    e = tl.load(block_expert + b)
    if e >= 0:
        rows = tl.load(sorted_pairs + b * BLOCK_T + tl.arange(0, BLOCK_T))
        live = rows >= 0
        pair = tl.where(live, rows, 0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mn = n < D
        expert = w_down + e.to(tl.int64) * D * F
        y = _block_product(act + pair[:, None] * F, live, expert + n[:, None].to(tl.int64) * F,
                           mn, F, tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32), BLOCK_K,
                           WBF16)
        scale = tl.load(weights + pair, mask=live, other=0.0)
        tl.store(pair_out + pair[:, None] * D + n[None, :], y * scale[:, None],
                 mask=live[:, None] & mn[None, :])


@triton.jit
def moe_sum(pair_out, out, T, D, K, BLOCK: tl.constexpr):
    """``out[t] = sum_k pair_out[t K + k]`` in order k = 0..K-1 for token row
    ``program_id(0)``, columns of tile ``program_id(1)``; grid ``(T, cdiv(D, BLOCK))``."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    md = d < D
    acc = tl.load(pair_out + (t * K) * D + d, mask=md, other=0.0)
    for k in range(1, K):
        acc += tl.load(pair_out + (t * K + k) * D + d, mask=md, other=0.0)
    tl.store(out + t * D + d, acc, mask=md)
