"""The row-invariant linear (op ``linear_invariant``) on the GPU.

Decode rows and speculative verification rows of a drafter core run this kernel (the
specification, "Complete speculative generation": a verified position's token must be
the one decode would emit there), so a verified row's logits must be the decode row's
bit for bit, whatever the number of rows in the step. The ``linear`` kernel cannot
promise that: its tiles follow the row count (GEMV at 1 row, FMA or MMA tiles above),
and each tile reduces K in its own order.

Here every variant constant follows the matrix alone (``capture.launch.
invariant_constants``: the batch-1 GEMV's ``BLOCK_N`` / ``BLOCK_K`` / warps and a fixed
``ROWS``), so a core holds one binary per matrix shape for every row count, and inside
it every row is computed by the same loop body: the row loop is a runtime loop, not
unrolled, over rows that share the program's weight tile. Row r's output is therefore
``((0 + s_0) + s_1) + ...`` over K steps in order, ``s_j = sum(w_j * x_r[j-th K step])``
reduced over the one tile layout of ``w_j``: a function of ``x_r`` and the weights only,
not of the other rows, of the row's place in its program, or of the grid.

The weight tile is loaded once per program and serves up to ``ROWS`` rows from
registers, so a verification of W <= ROWS positions of one lane reads the weights once,
as the decode row does (on the FMA units: 2 x ROWS flops per weight element).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def linear_rows(x, weight, out, T, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                ROWS: tl.constexpr, WBF16: tl.constexpr, K16: tl.constexpr,
                EVICT: tl.constexpr = 0):
    """``out[t, n] = sum_k x[t, k] * weight[n, k]`` (``helios_tools.kernels.
    linear_invariant``); x f32 ``[T, K]``, weight f32 or bf16 (WBF16) ``[N, K]``, out f32
    ``[T, N]``. Grid ``(cdiv(T, ROWS) * cdiv(N, BLOCK_N),)``: program ``p`` holds row
    group ``p % groups`` (rows ``ROWS * g .. ROWS * g + ROWS - 1`` below T) and weight
    rows ``BLOCK_N * (p // groups) ..``; the row groups of one weight tile are adjacent
    in launch order, so beyond ROWS rows the tile's later reads hit L2. EVICT=1 loads the
    weights evict-first (as the GEMV's variant)."""
    groups = tl.maximum(tl.cdiv(T, ROWS), 1)  # T = 0: one program that stores nothing
    pid = tl.program_id(0)
    g = pid % groups
    pid_n = pid // groups
    if K16:
        K = tl.multiple_of(K, 16)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mn = offs_n < N
    w_rows = weight + offs_n[:, None].to(tl.int64) * K
    r0 = g * ROWS
    live = tl.minimum(T - r0, ROWS)
    lanes = tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        mk = kk < K
        if EVICT:
            w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0,
                        eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + kk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        wf = w.to(tl.float32)
        for r in range(0, live):  # one body for every row: the row-invariance argument
            a = tl.load(x + (r0 + r).to(tl.int64) * K + kk, mask=mk, other=0.0)
            s = tl.sum(wf * a[None, :], axis=1)
            acc = tl.where((lanes == r)[:, None], acc + s[None, :], acc)
    dst = out + (r0 + lanes)[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(dst, acc, mask=(lanes < live)[:, None] & mn[None, :])
