"""Triton kernels for per-slot state: the device-owned pending token.

Semantics are those of ``helios_tools.kernels.slot_gather`` / ``slot_scatter``. One
program covers ``BLOCK`` submission rows; grid ``(cdiv(R, BLOCK),)``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def slot_gather(src, slot, out, R, S, BLOCK: tl.constexpr):
    """``out[r] = src[slot[r]]``, -1 for a slot outside ``[0, S)``."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mr = r < R
    s = tl.load(slot + r, mask=mr, other=-1)
    ok = (s >= 0) & (s < S)
    v = tl.load(src + tl.where(ok, s, 0), mask=mr & ok, other=-1)
    tl.store(out + r, tl.where(ok, v, -1), mask=mr)


@triton.jit
def slot_scatter(values, slot, decision, dst, R, S, BLOCK: tl.constexpr):
    """``dst[slot[r]] = values[r]`` for rows with ``decision[r] != 0`` and a valid slot."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mr = r < R
    s = tl.load(slot + r, mask=mr, other=-1)
    d = tl.load(decision + r, mask=mr, other=0)
    ok = mr & (d != 0) & (s >= 0) & (s < S)
    v = tl.load(values + r, mask=ok, other=0)
    tl.store(dst + tl.where(ok, s, 0), v, mask=ok)


@triton.jit
def row_copy(src, dst, src_rows, dst_rows, R, ROW, BLOCK: tl.constexpr):
    """``dst[dst_rows[r]] = src[src_rows[r]]`` for rows with both indices >= 0.

    Grid ``(R, cdiv(ROW, BLOCK))``: program (r, c) copies elements
    ``[c * BLOCK, (c + 1) * BLOCK)`` of row r. Row offsets are 64-bit (a host-tier plane
    can exceed 2**31 elements). ``src``/``dst`` may be device memory or pinned,
    device-mapped host memory (the host tier): the loads and stores are coalesced either
    way.
    """
    r = tl.program_id(0)
    c = tl.program_id(1)
    s = tl.load(src_rows + r).to(tl.int64)
    d = tl.load(dst_rows + r).to(tl.int64)
    if (s >= 0) & (d >= 0):
        offs = c * BLOCK + tl.arange(0, BLOCK)
        m = offs < ROW
        v = tl.load(src + s * ROW + offs, mask=m)
        tl.store(dst + d * ROW + offs, v, mask=m)
