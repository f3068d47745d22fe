"""W4A16 products ``*_int4`` (NumPy references: helios_tools/kernels/int4.py): packed
4-bit weight codes dequantized in registers, ``(code - zero) * scale`` per group of
``GROUP`` elements along K, against f32 activations. Byte j of a weight row holds
elements 2j (low nibble) and 2j + 1 (high), which share a group (``GROUP`` is even).
Four bodies, chosen by the launch rule (capture/launch.py: ``int4_rows_constants``,
``int4_tile_constants``):

- ``ROWS=1, WORDS=1`` (one token row, ``_w4a16_words``): 32-bit words of 8 codes, taken
  apart one nibble position at a time, so few registers hold a wide weight step;
- ``ROWS=1`` (a few token rows, ``_w4a16_rows``): up to ``BLOCK_T`` rows a program, the
  byte tile of a K step dequantized once and applied to each row (the weight is read
  once for all of them);
- ``MMA=2`` (from MMA_ROWS rows, ``_w4a16_group_tile``): a ``BLOCK_T x BLOCK_N`` output
  tile, one TF32 ``tl.dot`` a group (the activations rounded to TF32; ``code - zero`` is
  exact), the group's scale applied to the f32 partial product;
- the older forms, still selectable at capture: ``MMA=0`` without ROWS (``_w4a16_row``,
  one program per token row and ``BLOCK_N`` output rows, scales gathered per element)
  and ``MMA=1`` (``_w4a16_tile``, two half-group dots over bytes loaded one at a time).

``PRO`` selects the prologue applied to the activation row as it is loaded: 0 none,
2 SwiGLU (``x`` is ``[T, 2K]``: gate columns, then up); ``rmsnorm_linear_int4`` scales
the row by its reciprocal RMS (a first pass over the row) and the norm weight. ``ACC`` 1
adds the product into ``out`` (the residual). The ``*_int4_min`` kernels are the INT4_MIN
storage (repacked GGUF Q4_1 / Q4_K): the third side buffer holds minimums, ``w = code * scale + min``, and
the minimum multiplies the group's activation sum; they run the v1 row GEMV and the MMA=1
tile only (the launch rule keeps them there)."""

from __future__ import annotations

import triton
import triton.language as tl

from .dense import _rms_inv_row, _rms_inv_rows, _silu

# 2**23 as f32 bits: ``bits(MAGIC | c)`` is the f32 ``2**23 + c`` for a code c < 2**23, so
# a nibble becomes a float with one integer OR (no int-to-float conversion, which issues at
# a quarter of the FMA rate); subtracting ``2**23 + zero`` then gives ``c - zero`` exactly.
MAGIC = tl.constexpr(0x4B000000)
MAGIC_F = tl.constexpr(8388608.0)


@triton.jit
def _w4a16_row(x, norm_weight, weight, weight_scale, weight_zero, out, N, K, eps, pn, t,
               GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
               PRO: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr,
               MIN: tl.constexpr):
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    jb = tl.arange(0, BLOCK_B)  # byte index within the tile
    half = K // 2
    groups = K // GROUP
    width = K * 2 if PRO == 2 else K  # the activation row's stride
    xrow = x + t.to(tl.int64) * width
    rstd = 1.0
    if NORM:  # the RMS statistic of the whole row first
        sq = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for b0 in range(0, half, BLOCK_B):
            jj = b0 + jb
            mj = jj < half
            xe = tl.load(xrow + 2 * jj, mask=mj, other=0.0)
            xo = tl.load(xrow + 2 * jj + 1, mask=mj, other=0.0)
            sq += xe * xe + xo * xo
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    wrow = weight + n.to(tl.int64)[:, None] * half
    srow = weight_scale + n.to(tl.int64)[:, None] * groups
    zrow = weight_zero + n.to(tl.int64)[:, None] * groups
    for b0 in range(0, half, BLOCK_B):
        jj = b0 + jb
        mj = jj < half
        xe = tl.load(xrow + 2 * jj, mask=mj, other=0.0)
        xo = tl.load(xrow + 2 * jj + 1, mask=mj, other=0.0)
        if PRO == 2:  # silu(gate) * up
            ue = tl.load(xrow + K + 2 * jj, mask=mj, other=0.0)
            uo = tl.load(xrow + K + 2 * jj + 1, mask=mj, other=0.0)
            xe = xe / (1.0 + tl.exp(-xe)) * ue
            xo = xo / (1.0 + tl.exp(-xo)) * uo
        if NORM:
            xe = xe * rstd * tl.load(norm_weight + 2 * jj, mask=mj, other=0.0)
            xo = xo * rstd * tl.load(norm_weight + 2 * jj + 1, mask=mj, other=0.0)
        m2 = mn[:, None] & mj[None, :]
        byte = tl.load(wrow + jj[None, :], mask=m2, other=0)
        g = (2 * jj // GROUP)[None, :]
        s = tl.load(srow + g, mask=m2, other=0.0)
        z = tl.load(zrow + g, mask=m2, other=0.0)
        if MIN:  # code * scale + min: the minimum meets the sum of the activations
            lo = (byte & 0xF).to(tl.float32)
            hi = (byte >> 4).to(tl.float32)
            acc += tl.sum((lo * xe[None, :] + hi * xo[None, :]) * s
                          + z * (xe + xo)[None, :], axis=1)
        else:
            lo = (byte & 0xF).to(tl.float32) - z
            hi = (byte >> 4).to(tl.float32) - z
            acc += tl.sum((lo * xe[None, :] + hi * xo[None, :]) * s, axis=1)
    optr = out + t.to(tl.int64) * N + n
    if ACC:
        acc += tl.load(optr, mask=mn, other=0.0)
    tl.store(optr, acc, mask=mn)


@triton.jit
def _w4a16_rows(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K, eps, pn, pt,
                GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_G: tl.constexpr, PRO: tl.constexpr, NORM: tl.constexpr,
                ACC: tl.constexpr):
    """``ROWS=1`` (below MMA_ROWS token rows): ``BLOCK_T`` token rows x ``BLOCK_N`` output
    rows per program on the FMA units, the weight read once for all of its token rows.
    Each K step takes ``BLOCK_G`` whole groups: the codes as one ``[BLOCK_N, BLOCK_G,
    GROUP / 2]`` byte tile (16-byte vector loads: K is a multiple of GROUP), one scale and
    one zero point per (output row, group), both nibbles turned into ``code - zero``
    (f32, exact) once; then per token row the activations of those groups (loaded once a
    step, contiguous, split into even and odd columns), the group sums and the scales."""
    HALF: tl.constexpr = GROUP // 2
    groups = K // GROUP
    K = groups * GROUP  # the same K, said as a multiple of GROUP (vector loads)
    half = groups * HALF
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    n64 = n.to(tl.int64)
    rows = tl.arange(0, BLOCK_T)
    t = pt * BLOCK_T + rows
    mt = t < T
    width = K * 2 if PRO == 2 else K  # the activation row's stride
    if NORM:  # each row's reciprocal RMS first (the rmsnorm kernel's arithmetic)
        rstd = _rms_inv_rows(x + t.to(tl.int64)[:, None] * width, mt, K, eps, BLOCK_T,
                             HALF * 4)
    else:
        rstd = tl.full((BLOCK_T,), 1.0, tl.float32)
    gi = tl.arange(0, BLOCK_G)
    j = tl.arange(0, HALF)
    kk = tl.arange(0, GROUP)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    wrow = weight + n64[:, None, None] * half
    for g0 in range(0, groups, BLOCK_G):
        gg = g0 + gi
        mg = gg < groups
        byte = tl.load(wrow + (gg * HALF)[None, :, None] + j[None, None, :],
                       mask=mn[:, None, None] & mg[None, :, None], other=0)
        sz = n64[:, None] * groups + gg[None, :]
        m2 = mn[:, None] & mg[None, :]
        s = tl.load(weight_scale + sz, mask=m2, other=0.0)
        z = (tl.load(weight_zero + sz, mask=m2, other=0.0) + MAGIC_F)[:, :, None]
        b = byte.to(tl.int32)
        lo = ((b & 0xF) | MAGIC).to(tl.float32, bitcast=True) - z
        hi = ((b >> 4) | MAGIC).to(tl.float32, bitcast=True) - z
        kcol = (gg * GROUP)[:, None] + kk[None, :]  # [BLOCK_G, GROUP]
        mk = mg[:, None] & (kk >= 0)[None, :]
        if NORM:
            gain = tl.load(norm_weight + kcol, mask=mk, other=0.0)
        for i in tl.static_range(BLOCK_T):
            ti = pt * BLOCK_T + i
            xrow = x + ti.to(tl.int64) * width
            a = tl.load(xrow + kcol, mask=mk & (ti < T), other=0.0)
            if PRO == 2:  # silu(gate) * up
                a = _silu(a) * tl.load(xrow + K + kcol, mask=mk & (ti < T), other=0.0)
            if NORM:
                a = a * tl.sum(tl.where(rows == i, rstd, 0.0), axis=0) * gain
            xe, xo = tl.split(tl.reshape(a, (BLOCK_G, HALF, 2)))
            part = tl.sum(lo * xe[None, :, :] + hi * xo[None, :, :], axis=2)
            r = tl.sum(part * s, axis=1)
            acc = tl.where((rows == i)[:, None], acc + r[None, :], acc)
    optr = out + t.to(tl.int64)[:, None] * N + n[None, :]
    m = mt[:, None] & mn[None, :]
    if ACC:
        acc += tl.load(optr, mask=m, other=0.0)
    tl.store(optr, acc, mask=m)


@triton.jit
def _w4a16_words(x, norm_weight, weight, weight_scale, weight_zero, out, N, K, eps, pn, t,
                 GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                 PRO: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr):
    """``ROWS=1, WORDS=1`` (one token row): ``BLOCK_N`` output rows a program, K steps of
    ``BLOCK_G`` whole groups loaded as one ``[BLOCK_N, BLOCK_G, GROUP / 8]`` tile of 32-bit
    words (8 codes each: nibble i of word w is element ``8w + i``), then taken apart one
    nibble position at a time: ``code - zero`` of nibble i (exact in f32) times the
    activations at columns ``8w + i``, accumulated per word position. Only the raw words
    and one f32 value per word stay live (not the 8 dequantized values of each), so a
    program keeps a wide weight step in flight in few registers; the scales apply once
    per (output row, group) at the end of the step."""
    WPG: tl.constexpr = GROUP // 8  # words of one group of a weight row
    groups = K // GROUP
    K = groups * GROUP  # the same K, said as a multiple of GROUP (vector loads)
    words = groups * WPG
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    n64 = n.to(tl.int64)
    width = K * 2 if PRO == 2 else K  # the activation row's stride
    xrow = x + t.to(tl.int64) * width
    if NORM:  # the row's reciprocal RMS first (the rmsnorm kernel's arithmetic)
        rstd = _rms_inv_row(xrow, K, eps, GROUP * 4)
    else:
        rstd = 1.0
    gi = tl.arange(0, BLOCK_G)
    wi = tl.arange(0, WPG)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    wrow = weight.to(tl.pointer_type(tl.uint32)) + n64[:, None, None] * words
    for g0 in range(0, groups, BLOCK_G):
        gg = g0 + gi
        mg = gg < groups
        code = tl.load(wrow + (gg * WPG)[None, :, None] + wi[None, None, :],
                       mask=mn[:, None, None] & mg[None, :, None], other=0)
        sz = n64[:, None] * groups + gg[None, :]
        m2 = mn[:, None] & mg[None, :]
        s = tl.load(weight_scale + sz, mask=m2, other=0.0)
        z = (tl.load(weight_zero + sz, mask=m2, other=0.0) + MAGIC_F)[:, :, None]
        col = (gg * GROUP)[:, None] + 8 * wi[None, :]  # [BLOCK_G, WPG]: nibble 0's column
        mk = mg[:, None] & (wi >= 0)[None, :]
        part = tl.zeros((BLOCK_N, BLOCK_G, WPG), dtype=tl.float32)
        for i in tl.static_range(8):
            a = tl.load(xrow + col + i, mask=mk, other=0.0)
            if PRO == 2:  # silu(gate) * up
                a = _silu(a) * tl.load(xrow + K + col + i, mask=mk, other=0.0)
            if NORM:
                a = a * rstd * tl.load(norm_weight + col + i, mask=mk, other=0.0)
            d = (((code >> (4 * i)) & 0xF) | MAGIC).to(tl.float32, bitcast=True) - z
            part += d * a[None, :, :]
        acc += tl.sum(tl.sum(part, axis=2) * s, axis=1)
    optr = out + t.to(tl.int64) * N + n
    if ACC:
        acc += tl.load(optr, mask=mn, other=0.0)
    tl.store(optr, acc, mask=mn)


@triton.jit
def _tf32(x):
    """f32 `x` rounded to TF32 (10 mantissa bits; to nearest, ties away, as
    ``cvt.rna.tf32.f32``), kept as f32: exactly what a TF32 ``tl.dot`` reads, however
    the tensor cores round."""
    u = x.to(tl.uint32, bitcast=True)
    return ((u + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _w4a16_tile(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K, eps, pn, pt,
                GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                PRO: tl.constexpr, NORM: tl.constexpr, ACC: tl.constexpr,
                MIN: tl.constexpr):
    HALF: tl.constexpr = GROUP // 2  # bytes of one group of a weight row
    t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    mt = t < T
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    j = tl.arange(0, HALF)
    half = K // 2
    groups = K // GROUP
    width = K * 2 if PRO == 2 else K
    xrow = x + t.to(tl.int64)[:, None] * width
    rstd = tl.full((BLOCK_T,), 1.0, tl.float32)
    if NORM:  # each row's RMS statistic first
        sq = tl.zeros((BLOCK_T, HALF), dtype=tl.float32)
        for b0 in range(0, half, HALF):
            jj = (b0 + j)[None, :]
            xe = tl.load(xrow + 2 * jj, mask=mt[:, None], other=0.0)
            xo = tl.load(xrow + 2 * jj + 1, mask=mt[:, None], other=0.0)
            sq += xe * xe + xo * xo
        rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    n64 = n.to(tl.int64)
    for g in range(0, groups):
        jj = g * HALF + j
        xe = tl.load(xrow + 2 * jj[None, :], mask=mt[:, None], other=0.0)
        xo = tl.load(xrow + 2 * jj[None, :] + 1, mask=mt[:, None], other=0.0)
        if PRO == 2:  # silu(gate) * up
            ue = tl.load(xrow + K + 2 * jj[None, :], mask=mt[:, None], other=0.0)
            uo = tl.load(xrow + K + 2 * jj[None, :] + 1, mask=mt[:, None], other=0.0)
            xe = xe / (1.0 + tl.exp(-xe)) * ue
            xo = xo / (1.0 + tl.exp(-xo)) * uo
        if NORM:
            xe = xe * rstd[:, None] * tl.load(norm_weight + 2 * jj)[None, :]
            xo = xo * rstd[:, None] * tl.load(norm_weight + 2 * jj + 1)[None, :]
        byte = tl.load(weight + n64[:, None] * half + jj[None, :], mask=mn[:, None], other=0)
        z = tl.load(weight_zero + n64 * groups + g, mask=mn, other=0.0)
        s = tl.load(weight_scale + n64 * groups + g, mask=mn, other=0.0)
        if MIN:  # code * scale + min: the minimum times the group's activation sum
            # The codes 0..15 are not centred, so the dot is the difference of two large
            # terms: its activations and the sum's must be the same values, the TF32
            # ones, or the sum's f32 activations leave the dot's rounding uncancelled
            # (SmolLM2 Q4_1 logits 0.15 off the reference instead of 0.02, emulated).
            xe = _tf32(xe)
            xo = _tf32(xo)
            lo = (byte & 0xF).to(tl.float32)
            hi = (byte >> 4).to(tl.float32)
            part = tl.dot(xe, tl.trans(lo)) + tl.dot(xo, tl.trans(hi))
            acc += part * s[None, :] + tl.sum(xe + xo, axis=1)[:, None] * z[None, :]
        else:
            lo = (byte & 0xF).to(tl.float32) - z[:, None]
            hi = (byte >> 4).to(tl.float32) - z[:, None]
            part = tl.dot(xe, tl.trans(lo)) + tl.dot(xo, tl.trans(hi))
            acc += part * s[None, :]
    optr = out + t.to(tl.int64)[:, None] * N + n[None, :]
    m2 = mt[:, None] & mn[None, :]
    if ACC:
        acc += tl.load(optr, mask=m2, other=0.0)
    tl.store(optr, acc, mask=m2)


@triton.jit
def _w4a16_group_tile(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K, eps,
                      pn, pt, GROUP: tl.constexpr, BLOCK_T: tl.constexpr,
                      BLOCK_N: tl.constexpr, PRO: tl.constexpr, NORM: tl.constexpr,
                      ACC: tl.constexpr):
    """``MMA=2``: a ``BLOCK_T x BLOCK_N`` output tile, one ``tl.dot`` a group: the group's
    ``[BLOCK_N, GROUP / 2]`` byte tile (16-byte vector loads: K is said to be a multiple
    of GROUP) becomes ``code - zero`` in element order (both nibbles interleaved with
    ``tl.join``, exact in f32 and TF32), multiplied by the ``[BLOCK_T, GROUP]`` activation
    tile (contiguous loads) on TF32 tensor cores; the group's scale multiplies the f32
    partial product. (MMA=1, the older tile, loads bytes one at a time, even and odd
    activation columns as two strided loads, and runs two half-group dots.)"""
    HALF: tl.constexpr = GROUP // 2
    groups = K // GROUP
    K = groups * GROUP  # the same K, said as a multiple of GROUP (vector loads)
    half = groups * HALF
    t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
    mt = t < T
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    n64 = n.to(tl.int64)
    j = tl.arange(0, HALF)
    kk = tl.arange(0, GROUP)
    width = K * 2 if PRO == 2 else K
    xrow = x + t.to(tl.int64)[:, None] * width
    if NORM:  # each row's reciprocal RMS first (the rmsnorm kernel's arithmetic)
        rstd = _rms_inv_rows(xrow, mt, K, eps, BLOCK_T, GROUP)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    wrow = weight + n64[:, None] * half
    for g in range(0, groups):
        kcol = g * GROUP + kk
        a = tl.load(xrow + kcol[None, :], mask=mt[:, None], other=0.0)
        if PRO == 2:  # silu(gate) * up
            a = _silu(a) * tl.load(xrow + K + kcol[None, :], mask=mt[:, None], other=0.0)
        if NORM:
            a = a * rstd[:, None] * tl.load(norm_weight + kcol)[None, :]
        byte = tl.load(wrow + (g * HALF + j)[None, :], mask=mn[:, None], other=0)
        z = (tl.load(weight_zero + n64 * groups + g, mask=mn, other=0.0) + MAGIC_F)[:, None]
        s = tl.load(weight_scale + n64 * groups + g, mask=mn, other=0.0)
        b = byte.to(tl.int32)
        lo = ((b & 0xF) | MAGIC).to(tl.float32, bitcast=True) - z
        hi = ((b >> 4) | MAGIC).to(tl.float32, bitcast=True) - z
        w = tl.reshape(tl.join(lo, hi), (BLOCK_N, GROUP))
        acc += tl.dot(a, tl.trans(w)) * s[None, :]
    optr = out + t.to(tl.int64)[:, None] * N + n[None, :]
    m2 = mt[:, None] & mn[None, :]
    if ACC:
        acc += tl.load(optr, mask=m2, other=0.0)
    tl.store(optr, acc, mask=m2)


@triton.jit
def linear_int4(x, weight, weight_scale, weight_zero, out, T, N, K,
                GROUP: tl.constexpr = 128, BLOCK_N: tl.constexpr = 16,
                BLOCK_B: tl.constexpr = 256, PRO: tl.constexpr = 0, ACC: tl.constexpr = 0,
                MMA: tl.constexpr = 0, BLOCK_T: tl.constexpr = 32, ROWS: tl.constexpr = 0,
                BLOCK_G: tl.constexpr = 1, WORDS: tl.constexpr = 0):
    """Grid ``(cdiv(T, BLOCK_T), cdiv(N, BLOCK_N))`` with ROWS=1 (``(T, cdiv(N, BLOCK_N))``
    for the v1 row GEMV, MMA=0), ``(cdiv(N, BLOCK_N), cdiv(T, BLOCK_T))`` with MMA=1/2."""
    if MMA == 2:
        _w4a16_group_tile(x, x, weight, weight_scale, weight_zero, out, T, N, K, 0.0,
                          tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, PRO, 0,
                          ACC)
    elif MMA:
        _w4a16_tile(x, x, weight, weight_scale, weight_zero, out, T, N, K, 0.0,
                    tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, PRO, 0, ACC,
                    0)
    elif ROWS and WORDS:
        _w4a16_words(x, x, weight, weight_scale, weight_zero, out, N, K, 0.0,
                     tl.program_id(1), tl.program_id(0), GROUP, BLOCK_N, BLOCK_G, PRO, 0, ACC)
    elif ROWS:
        _w4a16_rows(x, x, weight, weight_scale, weight_zero, out, T, N, K, 0.0,
                    tl.program_id(1), tl.program_id(0), GROUP, BLOCK_T, BLOCK_N, BLOCK_G,
                    PRO, 0, ACC)
    else:
        _w4a16_row(x, x, weight, weight_scale, weight_zero, out, N, K, 0.0, tl.program_id(1),
                   tl.program_id(0), GROUP, BLOCK_N, BLOCK_B, PRO, 0, ACC, 0)


@triton.jit
def rmsnorm_linear_int4(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K, eps,
                        GROUP: tl.constexpr = 128, BLOCK_N: tl.constexpr = 16,
                        BLOCK_B: tl.constexpr = 256, PRO: tl.constexpr = 0,
                        ACC: tl.constexpr = 0, MMA: tl.constexpr = 0,
                        BLOCK_T: tl.constexpr = 32, ROWS: tl.constexpr = 0,
                        BLOCK_G: tl.constexpr = 1, WORDS: tl.constexpr = 0):
    """``linear_int4`` of ``rmsnorm(x)``; the same grids."""
    if MMA == 2:
        _w4a16_group_tile(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K,
                          eps, tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N,
                          0, 1, ACC)
    elif MMA:
        _w4a16_tile(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K, eps,
                    tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, 0, 1, ACC,
                    0)
    elif ROWS and WORDS:
        _w4a16_words(x, norm_weight, weight, weight_scale, weight_zero, out, N, K, eps,
                     tl.program_id(1), tl.program_id(0), GROUP, BLOCK_N, BLOCK_G, 0, 1, ACC)
    elif ROWS:
        _w4a16_rows(x, norm_weight, weight, weight_scale, weight_zero, out, T, N, K, eps,
                    tl.program_id(1), tl.program_id(0), GROUP, BLOCK_T, BLOCK_N, BLOCK_G,
                    0, 1, ACC)
    else:
        _w4a16_row(x, norm_weight, weight, weight_scale, weight_zero, out, N, K, eps,
                   tl.program_id(1), tl.program_id(0), GROUP, BLOCK_N, BLOCK_B, 0, 1, ACC, 0)


@triton.jit
def linear_int4_min(x, weight, weight_scale, weight_min, out, T, N, K,
                    GROUP: tl.constexpr = 32, BLOCK_N: tl.constexpr = 16,
                    BLOCK_B: tl.constexpr = 256, PRO: tl.constexpr = 0,
                    ACC: tl.constexpr = 0, MMA: tl.constexpr = 0,
                    BLOCK_T: tl.constexpr = 32):
    if MMA:
        _w4a16_tile(x, x, weight, weight_scale, weight_min, out, T, N, K, 0.0,
                    tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, PRO, 0, ACC,
                    1)
    else:
        _w4a16_row(x, x, weight, weight_scale, weight_min, out, N, K, 0.0, tl.program_id(1),
                   tl.program_id(0), GROUP, BLOCK_N, BLOCK_B, PRO, 0, ACC, 1)


@triton.jit
def rmsnorm_linear_int4_min(x, norm_weight, weight, weight_scale, weight_min, out, T, N, K,
                            eps, GROUP: tl.constexpr = 32, BLOCK_N: tl.constexpr = 16,
                            BLOCK_B: tl.constexpr = 256, PRO: tl.constexpr = 0,
                            ACC: tl.constexpr = 0, MMA: tl.constexpr = 0,
                            BLOCK_T: tl.constexpr = 32):
    if MMA:
        _w4a16_tile(x, norm_weight, weight, weight_scale, weight_min, out, T, N, K, eps,
                    tl.program_id(0), tl.program_id(1), GROUP, BLOCK_T, BLOCK_N, 0, 1, ACC,
                    1)
    else:
        _w4a16_row(x, norm_weight, weight, weight_scale, weight_min, out, N, K, eps,
                   tl.program_id(1), tl.program_id(0), GROUP, BLOCK_N, BLOCK_B, 0, 1, ACC, 1)


# Each INT4 and INT4_MIN form -> its kernel (the constants PRO and ACC select the variant).
INT4_TRITON = {"linear_int4": linear_int4, "linear_add_int4": linear_int4,
               "swiglu_linear_int4": linear_int4, "swiglu_linear_add_int4": linear_int4,
               "rmsnorm_linear_int4": rmsnorm_linear_int4,
               "linear_int4_min": linear_int4_min, "linear_add_int4_min": linear_int4_min,
               "swiglu_linear_int4_min": linear_int4_min,
               "swiglu_linear_add_int4_min": linear_int4_min,
               "rmsnorm_linear_int4_min": rmsnorm_linear_int4_min}
