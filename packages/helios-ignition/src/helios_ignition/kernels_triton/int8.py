"""W8A16 products ``*_int8`` (NumPy references: helios_tools/kernels/int8.py): int8 weight
codes (repacked GGUF Q8_0 / Q5_0 / Q6_K) times their group scale, ``code * scale`` per
group of ``GROUP`` (32 or 16) elements along K, against f32 activations. The same two
paths as the W4A16 kernels (kernels_triton/int4.py): below ``MMA_ROWS`` token rows a GEMV
per row (one program per ``BLOCK_N`` output rows and token row, FMA over ``BLOCK_B``
columns a step); from it (``MMA`` 1) ``BLOCK_T`` x ``BLOCK_N`` output tiles, per group the
codes (exact small integers) times the activations with ``tl.dot`` (TF32 tensor cores:
the activations rounded to TF32) and the group's scale applied to the f32 partial
product. ``PRO`` 2 is the SwiGLU prologue (``x`` is ``[T, 2K]``), ``NORM`` 1 the RMS-norm
prologue (``rmsnorm_linear_int8``), ``ACC`` 1 adds into ``out`` (the residual).
``embedding_int8`` gathers token rows of an INT8 table (the embedding, and a tied LM head's
``linear_int8`` reads the same codes)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _act(xrow, norm_weight, K, cols, mask, rstd, PRO: tl.constexpr, NORM: tl.constexpr):
    """Activation columns `cols` of a row (or rows) after the prologue."""
    xv = tl.load(xrow + cols, mask=mask, other=0.0)
    if PRO == 2:  # silu(gate) * up
        up = tl.load(xrow + K + cols, mask=mask, other=0.0)
        xv = xv / (1.0 + tl.exp(-xv)) * up
    if NORM:
        xv = xv * rstd * tl.load(norm_weight + cols, mask=mask, other=0.0)
    return xv


@triton.jit
def _w8a16_row(x, norm_weight, weight, weight_scale, out, N, K, eps, pn, t,
               GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
               PRO: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr):
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    jb = tl.arange(0, BLOCK_B)
    groups = K // GROUP
    width = K * 2 if PRO == 2 else K
    xrow = x + t.to(tl.int64) * width
    rstd = 1.0
    if NORM:  # the RMS statistic of the whole row first
        sq = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for b0 in range(0, K, BLOCK_B):
            jj = b0 + jb
            xv = tl.load(xrow + jj, mask=jj < K, other=0.0)
            sq += xv * xv
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    wrow = weight + n.to(tl.int64)[:, None] * K
    srow = weight_scale + n.to(tl.int64)[:, None] * groups
    for b0 in range(0, K, BLOCK_B):
        jj = b0 + jb
        mj = jj < K
        xv = _act(xrow, norm_weight, K, jj, mj, rstd, PRO, NORM)
        m2 = mn[:, None] & mj[None, :]
        code = tl.load(wrow + jj[None, :], mask=m2, other=0).to(tl.int8, bitcast=True)
        s = tl.load(srow + (jj // GROUP)[None, :], mask=m2, other=0.0)
        acc += tl.sum(code.to(tl.float32) * s * xv[None, :], axis=1)
    optr = out + t.to(tl.int64) * N + n
    if ACC:
        acc += tl.load(optr, mask=mn, other=0.0)
    tl.store(optr, acc, mask=mn)


@triton.jit
def _w8a16_tile(x, norm_weight, weight, weight_scale, out, T, N, K, eps, pn, pt,
                GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                PRO: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr):
    t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    mt = t < T
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    j = tl.arange(0, GROUP)
    groups = K // GROUP
    width = K * 2 if PRO == 2 else K
    xrow = x + t.to(tl.int64)[:, None] * width
    rstd = tl.full((BLOCK_T, 1), 1.0, tl.float32)
    if NORM:  # each row's RMS statistic first
        sq = tl.zeros((BLOCK_T, GROUP), dtype=tl.float32)
        for b0 in range(0, K, GROUP):
            xv = tl.load(xrow + (b0 + j)[None, :], mask=mt[:, None], other=0.0)
            sq += xv * xv
        rstd = (1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps))[:, None]
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    n64 = n.to(tl.int64)
    for g in range(0, groups):
        cols = g * GROUP + j
        xv = _act(xrow, norm_weight, K, cols[None, :], mt[:, None], rstd, PRO, NORM)
        code = tl.load(weight + n64[:, None] * K + cols[None, :], mask=mn[:, None],
                       other=0).to(tl.int8, bitcast=True)
        s = tl.load(weight_scale + n64 * groups + g, mask=mn, other=0.0)
        acc += tl.dot(xv, tl.trans(code.to(tl.float32))) * s[None, :]
    optr = out + t.to(tl.int64)[:, None] * N + n[None, :]
    m2 = mt[:, None] & mn[None, :]
    if ACC:
        acc += tl.load(optr, mask=m2, other=0.0)
    tl.store(optr, acc, mask=m2)


@triton.jit
def linear_int8(x, weight, weight_scale, out, T, N, K,
                GROUP: tl.constexpr = 32, BLOCK_N: tl.constexpr = 16,
                BLOCK_B: tl.constexpr = 256, PRO: tl.constexpr = 0, ACC: tl.constexpr = 0,
                MMA: tl.constexpr = 0, BLOCK_T: tl.constexpr = 32):
    if MMA:
        _w8a16_tile(x, x, weight, weight_scale, out, T, N, K, 0.0, tl.program_id(0),
                    tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, PRO, 0, ACC)
    else:
        _w8a16_row(x, x, weight, weight_scale, out, N, K, 0.0, tl.program_id(1),
                   tl.program_id(0), GROUP, BLOCK_N, BLOCK_B, PRO, 0, ACC)


@triton.jit
def rmsnorm_linear_int8(x, norm_weight, weight, weight_scale, out, T, N, K, eps,
                        GROUP: tl.constexpr = 32, BLOCK_N: tl.constexpr = 16,
                        BLOCK_B: tl.constexpr = 256, PRO: tl.constexpr = 0,
                        ACC: tl.constexpr = 0, MMA: tl.constexpr = 0,
                        BLOCK_T: tl.constexpr = 32):
    if MMA:
        _w8a16_tile(x, norm_weight, weight, weight_scale, out, T, N, K, eps,
                    tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, 0, 1, ACC)
    else:
        _w8a16_row(x, norm_weight, weight, weight_scale, out, N, K, eps, tl.program_id(1),
                   tl.program_id(0), GROUP, BLOCK_N, BLOCK_B, 0, 1, ACC)


@triton.jit
def embedding_int8(ids, weight, weight_scale, out, T, D, BLOCK_D: tl.constexpr,
                   VOCAB: tl.constexpr, GROUP: tl.constexpr = 32):
    """``out[t] = code[ids[t]] * scale`` (zeros for an id outside ``[0, VOCAB)``); grid
    ``(T,)``: one program a token row."""
    t = tl.program_id(0)
    tok = tl.load(ids + t)
    d = tl.arange(0, BLOCK_D)
    md = d < D
    ok = (tok >= 0) & (tok < VOCAB)
    row = tl.where(ok, tok, 0).to(tl.int64)
    code = tl.load(weight + row * D + d, mask=md & ok, other=0).to(tl.int8, bitcast=True)
    s = tl.load(weight_scale + row * (D // GROUP) + d // GROUP, mask=md & ok, other=0.0)
    tl.store(out + t.to(tl.int64) * D + d, code.to(tl.float32) * s, mask=md)


# Each INT8 form -> its kernel (the constants PRO and ACC select the variant).
INT8_TRITON = {"linear_int8": linear_int8, "linear_add_int8": linear_int8,
               "swiglu_linear_int8": linear_int8, "swiglu_linear_add_int8": linear_int8,
               "rmsnorm_linear_int8": rmsnorm_linear_int8, "embedding_int8": embedding_int8}
