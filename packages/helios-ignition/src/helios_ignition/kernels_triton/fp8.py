"""FP8 (e4m3) W8A8 products: the ``*_fp8`` ops (NumPy references: helios_tools/kernels/fp8.py).

One kernel serves the five ops (``PRO``: the prologue, ``ACC``: the residual add). Every
row count keeps the reference's W8A8 arithmetic (activations quantized per token, e4m3
weight codes with one scale per output channel), so a row's result does not depend on
the rows launched beside it beyond the f32 summation order of its path (see
``launch.fp8_constants``: one path per row count, the same for every row of a launch).

Each program owns ``BLOCK_T`` token rows x ``BLOCK_N`` output features and reads K twice:

1. the prologue pass (``_row_scales``): each row's ``max |a|`` over K, where ``a`` is the
   prologue's output (``x``; ``rmsnorm(x)``, whose max is the reciprocal RMS times
   ``max |x * g|``, so one pass gives both; ``silu(gate) * up``), giving the per-token
   scale ``s = max / 448`` (1 for a zero row). It reads only activations (L2-resident at
   decode sizes), in ``BLOCK_KS``-wide steps with [BLOCK_T] running values (no tile-wide
   accumulator: registers stay with the product);
2. the product: each K tile of ``a`` is quantized (``a / s``, saturated to +-448, converted
   to e4m3 round-to-nearest-even) and multiplied with the weight's e4m3 codes (one byte a
   weight: half the bf16 GEMV's bytes):

   - ``MMA=0`` (batch-1 decode, and by default a few rows: ``BLOCK_T`` token rows a
     program): the GEMV on the FMA units, as dense.py's batch-1 GEMV (``BLOCK_N`` weight
     rows a tile, wide K steps, no split-K), the codes converted to f32 in registers once
     a K step and applied to each token row in turn (the decoded activation codes
     broadcast over the weight rows);
   - ``MMA=1``: ``tl.dot`` of float8e4nv operands (FP8 wgmma on sm_90 at 64-row tiles,
     mma.sync below) with the f32 accumulator kept in the dot. ``IMPRECISE`` > 0 passes
     ``max_num_imprecise_acc`` (Triton then adds the MMA's partial sums into a separate
     f32 accumulator every IMPRECISE products along K, the DeepSeek-V3 promotion, since
     sm_90's FP8 MMA keeps about 14 bits); 0 leaves Triton's sm_90 default (no promotion).

   ``EARLY=1`` (the GEMV): the first K step's codes are loaded before the prologue pass.

   The epilogue multiplies by ``s[t] * weight_scale[n]`` and stores (``ACC``: adds).
   ``TILES`` > 1: a program computes that many consecutive column tiles after one
   prologue pass (fewer passes over the activations, fewer programs).

Prologues: ``PRO`` 0 (``linear_fp8``, ``linear_add_fp8``), 1 (``rmsnorm_linear_fp8``),
2 (``swiglu_linear_fp8``, ``swiglu_linear_add_fp8``: x is ``[T, 2K]``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dense import _kmask, _silu

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def _load_pro(rows, kk, mask, K, PRO: tl.constexpr):
    """The prologue's input at row pointers `rows` and columns `kk` (any matching shapes):
    ``x`` (PRO 0 and 1: the RMS norm is applied by the caller) or ``silu(gate) * up``."""
    a = tl.load(rows + kk, mask=mask, other=0.0)
    if PRO == 2:
        a = _silu(a) * tl.load(rows + K + kk, mask=mask, other=0.0)
    return a


@triton.jit
def _row_scales(rows, norm_weight, mt, K, eps, PRO: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_KS: tl.constexpr, EVEN_K: tl.constexpr):
    """Per-row activation scale ``s`` and reciprocal RMS ``inv`` (1 unless PRO 1), each
    ``[BLOCK_T]``, of the ``[BLOCK_T, 1]`` row pointers `rows` (`mt`: live rows)."""
    ks = tl.arange(0, BLOCK_KS)
    amax = tl.zeros((BLOCK_T,), dtype=tl.float32)
    ss = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_KS):
        kk = k0 + ks
        mk = kk < K
        a = _load_pro(rows, kk[None, :], _kmask(mt, kk, K, EVEN_K), K, PRO)
        if PRO == 1:
            ss += tl.sum(a * a, axis=1)
            a = a * tl.load(norm_weight + kk, mask=mk, other=0.0)[None, :]
        amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
    if PRO == 1:
        inv = tl.math.div_rn(1.0, tl.math.sqrt_rn(ss / K + eps))
    else:
        inv = tl.full((BLOCK_T,), 1.0, tl.float32)
    amax = amax * inv
    return tl.where(amax > 0, tl.math.div_rn(amax, E4M3_MAX), 1.0), inv


@triton.jit
def _quantize(a, s):
    """e4m3 codes of ``a / s`` (round to nearest even, saturated to +-448)."""
    a = tl.math.div_rn(a, s)
    return tl.minimum(tl.maximum(a, -E4M3_MAX), E4M3_MAX).to(tl.float8e4nv)


@triton.jit
def _gemv_row(x, norm_weight, weight, weight_scale, out, N, K, eps, PRO: tl.constexpr,
          ACC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          BLOCK_KS: tl.constexpr, EVICT: tl.constexpr, EVEN_K: tl.constexpr,
          TILES: tl.constexpr):
    """``MMA=0`` at ``BLOCK_T`` 1 without EARLY: token row ``program_id(1)`` x ``TILES``
    consecutive tiles of ``BLOCK_N`` weight rows on the FMA units (the prologue pass once
    for all of them). The batch-1 body the H100 sweep at dc8d9d8 timed, kept as it was:
    ``_gemv``'s one-row form compiles to more registers (107 against 72 at the 8B qkv
    pick)."""
    pn = tl.program_id(0)
    pt = tl.program_id(1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    stride = 2 * K if PRO == 2 else K
    row = x + pt * stride
    one = tl.arange(0, 1)
    s1, inv1 = _row_scales(row + one[:, None], norm_weight, one >= 0, K, eps, PRO, 1,
                           BLOCK_KS, EVEN_K)
    s = tl.sum(s1, axis=0)
    inv = tl.sum(inv1, axis=0)
    for i in range(0, TILES):
        n = (pn * TILES + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mn = n < N
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        wrows = weight + n.to(tl.int64)[:, None] * K
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            mk = kk < K
            wmask = _kmask(mn, kk, K, EVEN_K)
            if EVICT:
                codes = tl.load(wrows + kk[None, :], mask=wmask, other=0,
                                eviction_policy="evict_first")
            else:
                codes = tl.load(wrows + kk[None, :], mask=wmask, other=0)
            a = _load_pro(row, kk, mk, K, PRO)
            if PRO == 1:
                a = a * inv * tl.load(norm_weight + kk, mask=mk, other=0.0)
            qa = _quantize(a, s).to(tl.float32)
            w = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            acc += tl.sum(w * qa[None, :], axis=1)
        res = acc * s * tl.load(weight_scale + n, mask=mn, other=0.0)
        dst = out + pt * N + n
        if ACC:
            res = tl.load(dst, mask=mn, other=0.0) + res
        tl.store(dst, res, mask=mn)


@triton.jit
def _gemv_codes(weight, n, mn, k0, ks, K, EVICT: tl.constexpr, EVEN_K: tl.constexpr):
    """The e4m3 codes of weight rows `n` at columns ``k0 + ks``."""
    kk = k0 + ks
    ptrs = weight + n.to(tl.int64)[:, None] * K + kk[None, :]
    if EVICT:
        codes = tl.load(ptrs, mask=_kmask(mn, kk, K, EVEN_K), other=0,
                        eviction_policy="evict_first")
    else:
        codes = tl.load(ptrs, mask=_kmask(mn, kk, K, EVEN_K), other=0)
    return codes


@triton.jit
def _gemv_step(acc, codes, x, norm_weight, s, inv, t0, T, k0, ks, K, stride,
               PRO: tl.constexpr, BLOCK_T: tl.constexpr):
    """`acc` [BLOCK_T, BLOCK_N] plus one K step: the codes converted once, then each token
    row's activations quantized and reduced against them."""
    kk = k0 + ks
    mk = kk < K
    rows = tl.arange(0, BLOCK_T)
    w = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if PRO == 1:
        gain = tl.load(norm_weight + kk, mask=mk, other=0.0)
    if BLOCK_T == 1:  # batch 1: `acc` [BLOCK_N], `s` and `inv` scalars (fewer registers)
        a = _load_pro(x + t0.to(tl.int64) * stride, kk, mk, K, PRO)
        if PRO == 1:
            a = a * inv * gain
        acc += tl.sum(w * _quantize(a, s).to(tl.float32)[None, :], axis=1)
    else:
        for r in tl.static_range(BLOCK_T):
            row = x + (t0 + r).to(tl.int64) * stride
            a = _load_pro(row, kk, mk & (t0 + r < T), K, PRO)
            pick = rows == r
            if PRO == 1:
                a = a * tl.sum(tl.where(pick, inv, 0.0), axis=0) * gain
            qa = _quantize(a, tl.sum(tl.where(pick, s, 0.0), axis=0)).to(tl.float32)
            part = tl.sum(w * qa[None, :], axis=1)
            acc = tl.where(pick[:, None], acc + part[None, :], acc)
    return acc


@triton.jit
def _gemv(x, norm_weight, weight, weight_scale, out, T, N, K, eps, PRO: tl.constexpr,
          ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, BLOCK_KS: tl.constexpr, EVICT: tl.constexpr,
          EVEN_K: tl.constexpr, TILES: tl.constexpr, EARLY: tl.constexpr):
    """``MMA=0``: ``BLOCK_T`` token rows (from ``program_id(1) * BLOCK_T``) x ``TILES``
    consecutive tiles of ``BLOCK_N`` weight rows on the FMA units (the prologue pass once
    for all of them). Each K step loads and converts the weight tile once and applies it
    to every token row of the program (one at a time: the tile stays in registers), so a
    few-row product reads the weight once, as the batch-1 GEMV does. EARLY=1 issues the
    first tile's first K step of codes before the prologue pass, so the weight stream
    starts while the activation rows are scanned (the same sums in the same order)."""
    pn = tl.program_id(0)
    t0 = tl.program_id(1) * BLOCK_T
    ks = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_T)
    mt = t0 + rows < T
    stride = 2 * K if PRO == 2 else K
    if EARLY:
        n0 = pn * TILES * BLOCK_N + tl.arange(0, BLOCK_N)
        first = _gemv_codes(weight, n0, n0 < N, 0, ks, K, EVICT, EVEN_K)
    xrows = x + (t0 + rows).to(tl.int64)[:, None] * stride
    s, inv = _row_scales(xrows, norm_weight, mt, K, eps, PRO, BLOCK_T, BLOCK_KS, EVEN_K)
    if BLOCK_T == 1:
        s = tl.sum(s, axis=0)
        inv = tl.sum(inv, axis=0)
    for i in range(0, TILES):
        n = (pn * TILES + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mn = n < N
        if BLOCK_T == 1:
            acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        if EARLY:
            if i == 0:
                codes = first
            else:
                codes = _gemv_codes(weight, n, mn, 0, ks, K, EVICT, EVEN_K)
            acc = _gemv_step(acc, codes, x, norm_weight, s, inv, t0, T, 0, ks, K, stride,
                             PRO, BLOCK_T)
            kstart = BLOCK_K
        else:
            kstart = 0
        for k0 in range(kstart, K, BLOCK_K):
            codes = _gemv_codes(weight, n, mn, k0, ks, K, EVICT, EVEN_K)
            acc = _gemv_step(acc, codes, x, norm_weight, s, inv, t0, T, k0, ks, K, stride,
                             PRO, BLOCK_T)
        if BLOCK_T == 1:
            res = acc * s * tl.load(weight_scale + n, mask=mn, other=0.0)
            dst = out + t0.to(tl.int64) * N + n
            m = mn
        else:
            res = acc * s[:, None] * tl.load(weight_scale + n, mask=mn, other=0.0)[None, :]
            dst = out + (t0 + rows).to(tl.int64)[:, None] * N + n[None, :]
            m = mt[:, None] & mn[None, :]
        if ACC:
            res = tl.load(dst, mask=m, other=0.0) + res
        tl.store(dst, res, mask=m)


@triton.jit
def _mma(x, norm_weight, weight, weight_scale, out, T, N, K, eps, PRO: tl.constexpr,
         ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr, BLOCK_KS: tl.constexpr, IMPRECISE: tl.constexpr,
         EVEN_K: tl.constexpr, TILES: tl.constexpr):
    """``MMA=1``: ``TILES`` consecutive ``BLOCK_T x BLOCK_N`` output tiles of one token
    tile (the prologue pass once for all of them), e4m3 x e4m3 ``tl.dot`` over K."""
    pn = tl.program_id(0)
    pt = tl.program_id(1)
    t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    mt = t < T
    ks = tl.arange(0, BLOCK_K)
    stride = 2 * K if PRO == 2 else K
    rows = x + t.to(tl.int64)[:, None] * stride
    s, inv = _row_scales(rows, norm_weight, mt, K, eps, PRO, BLOCK_T, BLOCK_KS, EVEN_K)
    for i in range(0, TILES):
        n = (pn * TILES + i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mn = n < N
        wrows = weight + n.to(tl.int64)[:, None] * K
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            mk = kk < K
            a = _load_pro(rows, kk[None, :], _kmask(mt, kk, K, EVEN_K), K, PRO)
            if PRO == 1:
                a = a * inv[:, None] * tl.load(norm_weight + kk, mask=mk, other=0.0)[None, :]
            q = _quantize(a, s[:, None])
            codes = tl.load(wrows + kk[None, :], mask=_kmask(mn, kk, K, EVEN_K), other=0)
            w = tl.trans(codes.to(tl.float8e4nv, bitcast=True))
            if IMPRECISE:
                acc = tl.dot(q, w, acc, max_num_imprecise_acc=IMPRECISE)
            else:
                acc = tl.dot(q, w, acc)
        res = acc * s[:, None] * tl.load(weight_scale + n, mask=mn, other=0.0)[None, :]
        dst = out + t.to(tl.int64)[:, None] * N + n[None, :]
        mask = mt[:, None] & mn[None, :]
        if ACC:
            res = tl.load(dst, mask=mask, other=0.0) + res
        tl.store(dst, res, mask=mask)


@triton.jit
def _fp8_body(x, norm_weight, weight, weight_scale, out, T, N, K, eps,
              PRO: tl.constexpr, ACC: tl.constexpr, MMA: tl.constexpr,
              BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_KS: tl.constexpr, IMPRECISE: tl.constexpr, EVICT: tl.constexpr,
              K16: tl.constexpr, EVEN_K: tl.constexpr, TILES: tl.constexpr,
              EARLY: tl.constexpr):
    """K16=1: K is a multiple of 16, said in a form Triton's alignment analysis reads (as
    mma.py's _splitk does), so code and activation loads vectorize (without it every byte
    is its own load and the MMA tiles spill registers). EVEN_K=1: K is a multiple of both
    K steps (BLOCK_K, BLOCK_KS), so tile masks are constant along K (dense._kmask)."""
    if K16:
        K = (K // 16) * 16
    if MMA:
        _mma(x, norm_weight, weight, weight_scale, out, T, N, K, eps, PRO, ACC, BLOCK_T,
             BLOCK_N, BLOCK_K, BLOCK_KS, IMPRECISE, EVEN_K, TILES)
    elif BLOCK_T == 1 and not EARLY:
        _gemv_row(x, norm_weight, weight, weight_scale, out, N, K, eps, PRO, ACC, BLOCK_N,
                  BLOCK_K, BLOCK_KS, EVICT, EVEN_K, TILES)
    else:
        _gemv(x, norm_weight, weight, weight_scale, out, T, N, K, eps, PRO, ACC, BLOCK_T,
              BLOCK_N, BLOCK_K, BLOCK_KS, EVICT, EVEN_K, TILES, EARLY)


@triton.jit
def linear_fp8(x, weight, weight_scale, out, T, N, K, ACC: tl.constexpr = 0,
               PRO: tl.constexpr = 0, MMA: tl.constexpr = 1, BLOCK_T: tl.constexpr = 16,
               BLOCK_N: tl.constexpr = 64, BLOCK_K: tl.constexpr = 128,
               BLOCK_KS: tl.constexpr = 512, IMPRECISE: tl.constexpr = 0,
               EVICT: tl.constexpr = 0, K16: tl.constexpr = 0, EVEN_K: tl.constexpr = 0,
               TILES: tl.constexpr = 1, EARLY: tl.constexpr = 0):
    """``linear_fp8`` / ``linear_add_fp8`` (ACC=1) / the SwiGLU forms (PRO=2); grid
    ``(cdiv(N, BLOCK_N * TILES), cdiv(T, BLOCK_T))``."""
    _fp8_body(x, x, weight, weight_scale, out, T, N, K, 0.0, PRO, ACC, MMA, BLOCK_T,
              BLOCK_N, BLOCK_K, BLOCK_KS, IMPRECISE, EVICT, K16, EVEN_K, TILES, EARLY)


@triton.jit
def rmsnorm_linear_fp8(x, norm_weight, weight, weight_scale, out, T, N, K, eps,
                       ACC: tl.constexpr = 0, PRO: tl.constexpr = 1, MMA: tl.constexpr = 1,
                       BLOCK_T: tl.constexpr = 16, BLOCK_N: tl.constexpr = 64,
                       BLOCK_K: tl.constexpr = 128, BLOCK_KS: tl.constexpr = 512,
                       IMPRECISE: tl.constexpr = 0, EVICT: tl.constexpr = 0,
                       K16: tl.constexpr = 0, EVEN_K: tl.constexpr = 0,
                       TILES: tl.constexpr = 1, EARLY: tl.constexpr = 0):
    """``rmsnorm_linear_fp8``: the RMS norm in the prologue (PRO=1)."""
    _fp8_body(x, norm_weight, weight, weight_scale, out, T, N, K, eps, PRO, ACC, MMA,
              BLOCK_T, BLOCK_N, BLOCK_K, BLOCK_KS, IMPRECISE, EVICT, K16, EVEN_K, TILES,
              EARLY)


FP8_TRITON = {"linear_fp8": linear_fp8, "linear_add_fp8": linear_fp8,
              "swiglu_linear_fp8": linear_fp8, "swiglu_linear_add_fp8": linear_fp8,
              "rmsnorm_linear_fp8": rmsnorm_linear_fp8}
