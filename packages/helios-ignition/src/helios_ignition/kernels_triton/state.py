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
