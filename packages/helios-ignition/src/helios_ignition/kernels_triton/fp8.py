"""FP8 (e4m3) W8A8 products: the ``*_fp8`` ops (NumPy references: helios_tools/kernels/fp8.py).

One body serves the five ops. Each program owns ``BLOCK_T`` token rows x ``BLOCK_N``
output features and makes two passes over K:

1. the activation quantization, fused into the product's prologue (no launch of its own,
   no quantized copy in memory): each row's ``max |a|`` over K, where ``a`` is the
   prologue's output (``x``; ``rmsnorm(x)``, whose max is the reciprocal RMS times
   ``max |x * g|``, so one pass gives both; ``silu(gate) * up``), giving the per-token
   scale ``s = max / 448`` (1 for a zero row);
2. the product: each K tile of ``a`` is quantized (``a / s``, saturated to +-448,
   converted to e4m3 round-to-nearest-even) and multiplied with the weight's e4m3 codes:
   ``MMA=1`` on the tensor cores (``tl.dot`` of float8e4nv operands: FP8 wgmma on sm_90,
   each BLOCK_K tile's partial product added to an f32 accumulator, as DeepSeek-V3 promotes
   every 128 elements, since the MMA's own accumulation keeps about 14 bits), ``MMA=0`` (one row, batch-1 decode) on the FMA units over the
   decoded values (a GEMV reads each weight byte once; the tensor cores need 16 rows).
   The epilogue multiplies by ``s[t] * weight_scale[n]`` and stores (``ACC``: adds).

Prologues: ``PRO`` 0 (``linear_fp8``, ``linear_add_fp8``), 1 (``rmsnorm_linear_fp8``),
2 (``swiglu_linear_fp8``, ``swiglu_linear_add_fp8``: x is ``[T, 2K]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dense import _silu

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def _act(x, norm_weight, rows, mt, kk, K, PRO: tl.constexpr):
    """The prologue's output at rows `rows` ([BT, 1] row pointers) and columns `kk`
    ([BK]), before the RMS factor (PRO 1 multiplies by the norm's gain only)."""
    mask = mt[:, None] & (kk < K)[None, :]
    if PRO == 2:
        g = tl.load(rows + kk[None, :], mask=mask, other=0.0)
        u = tl.load(rows + K + kk[None, :], mask=mask, other=0.0)
        a = _silu(g) * u
    else:
        a = tl.load(rows + kk[None, :], mask=mask, other=0.0)
        if PRO == 1:
            a = a * tl.load(norm_weight + kk, mask=kk < K, other=0.0)[None, :]
    return a


@triton.jit
def _fp8_body(x, norm_weight, weight, weight_scale, out, T, N, K, eps,
              PRO: tl.constexpr, ACC: tl.constexpr, MMA: tl.constexpr,
              BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pn = tl.program_id(0)
    pt = tl.program_id(1)
    t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mt = t < T
    mn = n < N
    ks = tl.arange(0, BLOCK_K)
    stride = 2 * K if PRO == 2 else K
    rows = x + t.to(tl.int64)[:, None] * stride
    # Pass 1: per-token max |a| (and the sum of squares for the RMS norm).
    amax = tl.zeros((BLOCK_T,), dtype=tl.float32)
    ss = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = _act(x, norm_weight, rows, mt, kk, K, PRO)
        amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
        if PRO == 1:
            xa = tl.load(rows + kk[None, :], mask=mt[:, None] & (kk < K)[None, :], other=0.0)
            ss += xa * xa
    if PRO == 1:
        inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.sum(ss, axis=1) / K + eps))
    else:
        inv = tl.full((BLOCK_T,), 1.0, tl.float32)
    amax = amax * inv
    s = tl.where(amax > 0, tl.math.div_rn(amax, E4M3_MAX), 1.0)
    # Pass 2: quantized activations x e4m3 weight codes, f32 accumulation.
    if MMA:
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    wrows = weight + n.to(tl.int64)[:, None] * K
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        a = _act(x, norm_weight, rows, mt, kk, K, PRO)
        if PRO == 1:
            a = a * inv[:, None]
        a = tl.math.div_rn(a, s[:, None])
        q = tl.minimum(tl.maximum(a, -E4M3_MAX), E4M3_MAX).to(tl.float8e4nv)
        codes = tl.load(wrows + kk[None, :], mask=mn[:, None] & (kk < K)[None, :], other=0)
        w = codes.to(tl.float8e4nv, bitcast=True)
        if MMA:  # each K tile's product added in f32: sm_90's FP8 MMA accumulates in
            # about 14 bits within the tile (Triton's default never promotes on sm_90)
            acc += tl.dot(q, tl.trans(w), out_dtype=tl.float32)
        else:
            qa = tl.sum(q.to(tl.float32), axis=0)  # the one live row (BLOCK_T = 1)
            acc += tl.sum(w.to(tl.float32) * qa[None, :], axis=1)
    ws = tl.load(weight_scale + n, mask=mn, other=0.0)
    if MMA:
        res = acc * s[:, None] * ws[None, :]
        dst = out + t.to(tl.int64)[:, None] * N + n[None, :]
        mask = mt[:, None] & mn[None, :]
    else:
        res = acc * tl.sum(s, axis=0) * ws
        dst = out + pt * N + n
        mask = mn
    if ACC:
        res = tl.load(dst, mask=mask, other=0.0) + res
    tl.store(dst, res, mask=mask)


@triton.jit
def linear_fp8(x, weight, weight_scale, out, T, N, K, ACC: tl.constexpr = 0,
               PRO: tl.constexpr = 0, MMA: tl.constexpr = 1, BLOCK_T: tl.constexpr = 16,
               BLOCK_N: tl.constexpr = 64, BLOCK_K: tl.constexpr = 128):
    """``linear_fp8`` / ``linear_add_fp8`` (ACC=1) / the SwiGLU forms (PRO=2)."""
    _fp8_body(x, x, weight, weight_scale, out, T, N, K, 0.0, PRO, ACC, MMA, BLOCK_T,
              BLOCK_N, BLOCK_K)


@triton.jit
def rmsnorm_linear_fp8(x, norm_weight, weight, weight_scale, out, T, N, K, eps,
                       ACC: tl.constexpr = 0, PRO: tl.constexpr = 1, MMA: tl.constexpr = 1,
                       BLOCK_T: tl.constexpr = 16, BLOCK_N: tl.constexpr = 64,
                       BLOCK_K: tl.constexpr = 128):
    """``rmsnorm_linear_fp8``: the RMS norm in the prologue (PRO=1)."""
    _fp8_body(x, norm_weight, weight, weight_scale, out, T, N, K, eps, PRO, ACC, MMA,
              BLOCK_T, BLOCK_N, BLOCK_K)


FP8_TRITON = {"linear_fp8": linear_fp8, "linear_add_fp8": linear_fp8,
              "swiglu_linear_fp8": linear_fp8, "swiglu_linear_add_fp8": linear_fp8,
              "rmsnorm_linear_fp8": rmsnorm_linear_fp8}
