"""Triton kernels of the batched-decode GEMM path (8-256 token rows): activations split
once into packed bf16 terms, a K-split tensor-core product, a fixed-order reduction.

Ops (NumPy references in ``helios_tools.kernels.linear_splitk``):

- ``split_bf16`` / ``swiglu_split_bf16``: each f32 activation ``a`` (for the second,
  ``silu(gate) * up``) becomes two bf16 terms ``hi = bf16(a)``, ``lo = bf16(a - hi)``
  (``hi + lo`` keeps about 16 mantissa bits). Row ``t`` of the output, declared f32
  ``[T, K]``, holds the ``2K`` bf16 values ``hi[t, 0:K] | lo[t, 0:K]`` (the same bytes).
- ``linear_packed``: ``partial[s] = (hi + lo)[:, slice s] @ weight[:, slice s]^T`` over
  ``S`` fixed K slices (``splitk_slice``), a bf16 x bf16 product with f32 accumulation
  whose operands both come from memory as loaded (no conversion in the loop, so
  Triton's pipeliner stages both in shared memory for the tensor cores). The hi and lo
  rows of a token tile are stacked into one ``2*BLOCK_T``-row operand: one MMA per K
  step for both terms, the two halves of the accumulator added at the end.
  ``TC=1`` (prefill rows, one slice): the packed row as a ``2K``-long bf16 operand of a
  plain GEMM against the weight tile repeated, both operands by tensor-memory copies
  (``_packed_tc``).
- ``round_bf16`` / ``swiglu_round_bf16`` (the bf16-activation forms, ``LO=0``): ``hi``
  as above and zeros in place of ``lo``. ``linear_packed`` over them runs ``XSPLIT=0``
  (the hi terms only): the lo terms it skips are zero, so no value changes.
- ``linear_partial``: the same K split over f32 activations split in registers (the
  ``linear`` kernel's MMA body).
- ``splitk_reduce`` / ``splitk_reduce_add``: ``out = sum_s partial[s]`` in the order
  ``s = 0, 1, ..`` (``_add``: plus what ``out`` holds, the residual epilogue).

Each output row depends only on its own activation row (rows are independent MMA rows,
the slices and the reduction order are fixed by ``K`` and ``S``), so results do not
depend on the other rows of the batch. ``S = 1`` writes the product itself (no reduce).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dense import _kmask, _load_act, _split_bf16, _store_out, _tc_tile


@triton.jit
def _split_store(x, out, T, K, BLOCK: tl.constexpr, SWIGLU: tl.constexpr, LO: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = k < K
    if SWIGLU:
        row = x + t * 2 * K
    else:
        row = x + t * K
    hi, lo = _split_bf16(_load_act(row + k, m, K, SWIGLU))
    o = out.to(tl.pointer_type(tl.bfloat16), bitcast=True) + t * 2 * K
    tl.store(o + k, hi, mask=m)
    if LO:
        tl.store(o + K + k, lo, mask=m)
    else:
        tl.store(o + K + k, tl.zeros_like(hi), mask=m)


@triton.jit
def split_bf16(x, out, T, K, BLOCK: tl.constexpr, SWIGLU: tl.constexpr = 0,
               LO: tl.constexpr = 1):
    """``out[t] = hi(x[t]) | lo(x[t])`` as 2K packed bf16; grid ``(T, cdiv(K, BLOCK))``.
    ``SWIGLU=1`` is op ``swiglu_split_bf16``: ``x`` is ``[T, 2K]`` gate|up and the split
    value is ``silu(gate) * up`` (the ``silu_mul`` arithmetic). ``LO=0`` is op
    ``round_bf16`` (``swiglu_round_bf16`` with ``SWIGLU=1``): zeros in place of ``lo``."""
    _split_store(x, out, T, K, BLOCK, SWIGLU, LO)


@triton.jit
def _packed_tc(x, weight, out, T, N, K, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, XSPLIT: tl.constexpr, GROUP_T: tl.constexpr):
    """``linear_packed`` with one K slice as a plain bf16 GEMM (``TC=1``, prefill rows):
    the packed row ``hi | lo`` is a ``2K``-long bf16 operand against the weight tile
    repeated (``out = hi @ w^T + lo @ w^T``: K steps over the hi terms, then over the lo
    terms, into one f32 accumulator); ``XSPLIT=0`` stops after the hi terms (activations
    rounded to bf16). Both operands go from memory to shared memory by tensor-memory
    copies through device-side descriptors (global scratch) and from there to the wgmma,
    with nothing converted in registers; output tiles ``pid, pid + programs, ...`` in
    ``_tc_tile``'s grouped order. Needs ``K % BLOCK_K == 0``."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    tiles = tl.cdiv(T, BLOCK_T) * tl.cdiv(N, BLOCK_N)
    xb = x.to(tl.pointer_type(tl.bfloat16), bitcast=True)
    xd = tl.make_tensor_descriptor(xb, shape=[T, 2 * K], strides=[2 * K, 1],
                                   block_shape=[BLOCK_T, BLOCK_K])
    wd = tl.make_tensor_descriptor(weight, shape=[N, K], strides=[K, 1],
                                   block_shape=[BLOCK_N, BLOCK_K])
    steps = tl.cdiv(K, BLOCK_K) * (1 + XSPLIT)
    for tile in range(pid, tiles, G):
        pt, pn = _tc_tile(tile, T, N, BLOCK_T, BLOCK_N, GROUP_T)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for j in range(0, steps):
            k0 = j * BLOCK_K
            a = xd.load([pt * BLOCK_T, k0])
            w = wd.load([pn * BLOCK_N, k0 % K])
            acc = tl.dot(a, w.T, acc)
        offs_t = pt * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        dst = out + offs_t[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(dst, acc, mask=(offs_t < T)[:, None] & (offs_n < N)[None, :])


@triton.jit
def linear_splitk(x, weight, partial, T, N, K, S, BLOCK_T: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WBF16: tl.constexpr,
                  K16: tl.constexpr, PACKED: tl.constexpr = 1, XSPLIT: tl.constexpr = 1,
                  EVEN_K: tl.constexpr = 0, TC: tl.constexpr = 0, GROUP_T: tl.constexpr = 8,
                  ROWS_FIRST: tl.constexpr = 0):
    """``partial[s*T + t, n] = sum_{k in slice s} x[t, k] * weight[n, k]``; grid
    ``(cdiv(N, BLOCK_N), cdiv(T, BLOCK_T), S)``.

    Slice ``s`` is ``[s*KS, min((s+1)*KS, K))`` with ``KS = 128 * cdiv(cdiv(K, S), 128)``
    (``BLOCK_K`` divides 128, so only the last slice ends inside a K step). ``PACKED=1``
    (op ``linear_packed``): ``x`` holds the packed hi|lo bf16 rows of ``split_bf16`` and
    each K step is one MMA of the stacked ``[2*BLOCK_T, BLOCK_K]`` hi/lo tile. ``PACKED=0``
    (op ``linear_partial``): ``x`` is f32, split in registers into two MMAs on the same
    weight tile (``XSPLIT=0``: ``hi`` only, about 3 significant digits; sweeps only).
    ``PACKED=1, XSPLIT=0``: ``x`` holds ``round_bf16``'s ``hi | 0`` rows and each K step
    multiplies the hi rows only (``BLOCK_T`` MMA rows; the result equals ``XSPLIT=1``'s
    over the same buffer, whose lo terms add zeros).
    ``TC=1`` (``PACKED=1``, bf16 weights, ``S = 1``; prefill rows): ``_packed_tc`` on a
    1-D grid of at most one program per output tile. ``ROWS_FIRST=1`` (op
    ``linear_packed_rows``) swaps the first two grid axes, ``(cdiv(T, BLOCK_T),
    cdiv(N, BLOCK_N), S)``: the token tiles of one weight tile are adjacent in launch
    order, so beyond one token tile its later reads hit L2 (the arithmetic is unchanged).
    """
    if TC:
        _packed_tc(x, weight, partial, T, N, K, BLOCK_T, BLOCK_N, BLOCK_K, XSPLIT, GROUP_T)
    else:
        _splitk(x, weight, partial, T, N, K, S, BLOCK_T, BLOCK_N, BLOCK_K, WBF16, K16, PACKED,
                XSPLIT, EVEN_K, ROWS_FIRST)


@triton.jit
def _splitk(x, weight, partial, T, N, K, S, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, WBF16: tl.constexpr, K16: tl.constexpr,
            PACKED: tl.constexpr, XSPLIT: tl.constexpr, EVEN_K: tl.constexpr,
            ROWS_FIRST: tl.constexpr = 0):
    """The K-split body of ``linear_splitk`` (every ``TC=0`` variant)."""
    if ROWS_FIRST:
        pid_t = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:
        pid_n = tl.program_id(0)
        pid_t = tl.program_id(1)
    ks = tl.program_id(2)
    if K16:  # K % 16 == 0: say so in a form every Triton's alignment analysis reads
        K = (K // 16) * 16  # (tl.multiple_of on the scalar is lost by 3.6 and 3.9)
    span = tl.cdiv(tl.cdiv(K, S), 128) * 128
    k_lo = tl.multiple_of(ks * span, 128)
    k_hi = tl.minimum(K, k_lo + span)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mn = offs_n < N
    w_rows = weight + offs_n[:, None].to(tl.int64) * K
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    mt = offs_t < T
    if PACKED and not XSPLIT:
        # Rounded input (round_bf16: hi | 0): the hi rows alone, one BLOCK_T-row MMA per
        # K step; the zero lo terms would add exact zeros.
        xb = x.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        a_rows = xb + offs_t[:, None].to(tl.int64) * (2 * K)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + offs_k
            a = tl.load(a_rows + kk[None, :], mask=_kmask(mt, kk, K, EVEN_K), other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=_kmask(mn, kk, K, EVEN_K), other=0.0)
            if WBF16:
                acc = tl.dot(a, tl.trans(w), acc)
            else:
                acc = tl.dot(a.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
    elif PACKED:
        # Rows 0..BLOCK_T-1 of the operand are the tile's hi terms, the next BLOCK_T its lo.
        r = tl.arange(0, 2 * BLOCK_T)
        rt = pid_t * BLOCK_T + r % BLOCK_T
        mr = rt < T
        xb = x.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        a_rows = xb + rt[:, None].to(tl.int64) * (2 * K) + (r // BLOCK_T)[:, None] * K
        acc2 = tl.zeros((2 * BLOCK_T, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + offs_k
            a = tl.load(a_rows + kk[None, :], mask=_kmask(mr, kk, K, EVEN_K), other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=_kmask(mn, kk, K, EVEN_K), other=0.0)
            if WBF16:
                acc2 = tl.dot(a, tl.trans(w), acc2)
            else:  # f32 weights (f32 cores): the terms widened, IEEE f32 products
                acc2 = tl.dot(a.to(tl.float32), tl.trans(w), acc2, input_precision="ieee")
        acc = tl.sum(tl.reshape(acc2, (2, BLOCK_T, BLOCK_N)), axis=0)
    else:
        x_rows = x + offs_t[:, None].to(tl.int64) * K
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + offs_k
            a = tl.load(x_rows + kk[None, :], mask=_kmask(mt, kk, K, EVEN_K), other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=_kmask(mn, kk, K, EVEN_K), other=0.0)
            if WBF16:
                hi, lo = _split_bf16(a)
                wt = tl.trans(w)
                acc = tl.dot(hi, wt, acc)
                if XSPLIT:
                    acc = tl.dot(lo, wt, acc)
            else:
                acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    dst = partial + (ks * T + offs_t[:, None]).to(tl.int64) * N + offs_n[None, :]
    tl.store(dst, acc, mask=mt[:, None] & mn[None, :])


@triton.jit
def splitk_reduce(partial, out, T, N, S, BLOCK: tl.constexpr, ACC: tl.constexpr = 0):
    """``out[t] (+)= sum_{s=0..S-1} partial[s*T + t]`` in that order; grid
    ``(T, cdiv(N, BLOCK))``. ``ACC=1`` is op ``splitk_reduce_add`` (adds into ``out``)."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = n < N
    acc = tl.load(partial + t * N + n, mask=m, other=0.0)
    for s in range(1, S):
        acc += tl.load(partial + (s * T + t) * N + n, mask=m, other=0.0)
    _store_out(out + t * N + n, acc, m, ACC)
