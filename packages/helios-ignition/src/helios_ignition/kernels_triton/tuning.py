"""Triton kernels of the decode-split tuning producer (helios_tools.kernels.tuning).

``timer_mark`` reads the GPU's global timer (``%globaltimer``, nanoseconds) in a
one-program launch: launches of one stream run in order, so two marks bracket the work
recorded between them. Each is grid ``(1,)`` except ``split_tuning_setup`` (``(B,)``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer


@triton.jit
def timer_mark(stamps, index):
    """``stamps[index] = (low, high)`` 32-bit halves of the global timer."""
    now = globaltimer()
    tl.store(stamps + 2 * index, (now & 0xFFFFFFFF).to(tl.uint32))
    tl.store(stamps + 2 * index + 1, ((now >> 32) & 0xFFFFFFFF).to(tl.uint32))


@triton.jit
def split_tuning_setup(positions, slot, page_table, candidates, B, MP, PT, C, c0, c1, c2, c3,
                       BLOCK: tl.constexpr):
    """Row ``b``: position ``MP * PT - 1``, slot ``b``, pages ``(b + j) % MP``; program 0
    also stores the candidates (stride 4 i32)."""
    b = tl.program_id(0)
    tl.store(positions + b, MP * PT - 1)
    tl.store(slot + b, b)
    row = page_table + b.to(tl.int64) * MP
    for j0 in range(0, MP, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        tl.store(row + j, (b + j) % MP, mask=j < MP)
    if b == 0:
        tl.store(candidates, c0)
        if C > 1:
            tl.store(candidates + 4, c1)
        if C > 2:
            tl.store(candidates + 8, c2)
        if C > 3:
            tl.store(candidates + 12, c3)


@triton.jit
def split_tuning_select(stamps, candidates, choice, C, BLOCK_C: tl.constexpr):
    """``choice[0]`` = the candidate with the least time between its two marks (first of
    equals)."""
    i = tl.arange(0, BLOCK_C)
    mi = i < C
    lo0 = tl.load(stamps + 4 * i, mask=mi, other=0).to(tl.int64)
    hi0 = tl.load(stamps + 4 * i + 1, mask=mi, other=0).to(tl.int64)
    lo1 = tl.load(stamps + 4 * i + 2, mask=mi, other=0).to(tl.int64)
    hi1 = tl.load(stamps + 4 * i + 3, mask=mi, other=0).to(tl.int64)
    elapsed = ((hi1 << 32) | lo1) - ((hi0 << 32) | lo0)
    elapsed = tl.where(mi, elapsed, 9223372036854775807)
    best = tl.min(elapsed, axis=0)
    first = tl.min(tl.where(elapsed == best, i, BLOCK_C), axis=0)
    tl.store(choice, tl.load(candidates + 4 * first))
