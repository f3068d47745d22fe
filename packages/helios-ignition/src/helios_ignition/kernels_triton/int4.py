"""W4A16 product ``linear_int4`` (NumPy reference: helios_tools/kernels/int4.py): packed
4-bit weight codes dequantized in registers against f32 activations on the FMA units,
one program per ``BLOCK_N`` output rows and token row (a GEMV per row: batch-1 decode
reads each weight byte once). Byte j holds elements 2j (low nibble) and 2j + 1 (high),
which share a group scale (``GROUP`` is even), so the even and odd activation columns
load as two vectors and no interleave is needed."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def linear_int4(x, weight, weight_scale, out, T, N, K, GROUP: tl.constexpr = 128,
                BLOCK_N: tl.constexpr = 16, BLOCK_B: tl.constexpr = 256):
    pn = tl.program_id(0)
    t = tl.program_id(1)
    n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    jb = tl.arange(0, BLOCK_B)  # byte index within the tile
    half = K // 2
    groups = K // GROUP
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    xrow = x + t.to(tl.int64) * K
    wrow = weight + n.to(tl.int64)[:, None] * half
    srow = weight_scale + n.to(tl.int64)[:, None] * groups
    for b0 in range(0, half, BLOCK_B):
        jj = b0 + jb
        mj = jj < half
        xe = tl.load(xrow + 2 * jj, mask=mj, other=0.0)
        xo = tl.load(xrow + 2 * jj + 1, mask=mj, other=0.0)
        m2 = mn[:, None] & mj[None, :]
        byte = tl.load(wrow + jj[None, :], mask=m2, other=0)
        s = tl.load(srow + (2 * jj // GROUP)[None, :], mask=m2, other=0.0)
        lo = (byte & 0xF).to(tl.float32) - 8.0
        hi = (byte >> 4).to(tl.float32) - 8.0
        acc += tl.sum((lo * xe[None, :] + hi * xo[None, :]) * s, axis=1)
    tl.store(out + t.to(tl.int64) * N + n, acc, mask=mn)
