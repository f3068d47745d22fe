"""Dense projection kernel."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def linear(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
) -> None:
    """``out = x @ weight.T`` with weights in ``[out, in]`` (HF ``nn.Linear``) layout.

    Reference loop::

        for t in range(T):
            for n in range(N):
                out[t, n] = sum(x[t, k] * weight[n, k] for k in range(K))

    Args:
        x: ``[T, K]`` f32 activations.
        weight: ``[N, K]`` f32 (bf16 checkpoints are widened to f32 at load).
        out: ``[T, N]`` f32, written.
        T: token rows.
        N: output features.
        K: input features.
    """
    # One BLAS call on the free transposed view, then a copy. Not matmul(out=...): in
    # NumPy 2.4 that path skips the BLAS gemv for T = 1 and ran 5x slower here.
    out[:T, :N] = x[:T, :K] @ weight[:N, :K].T


# Weight bytes per GEMV call of ``linear_invariant`` over two or more rows: a chunk of
# output features small enough to stay in a core's L2 while every row reads it.
INVARIANT_CHUNK_BYTES = 1 << 19


def invariant_chunks(N: int, K: int) -> list[tuple[int, int]]:
    """Output-feature ranges ``[start, stop)`` of ``linear_invariant``'s GEMV calls.

    Fixed by (N, K) alone, multiples of 16 features, never a one-feature range (NumPy
    computes a one-row product with a dot, not a GEMV).
    """
    rows = max(16, INVARIANT_CHUNK_BYTES // (4 * max(K, 1)) // 16 * 16)
    bounds = [*range(0, N, rows), N]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def linear_invariant(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
) -> None:
    """``linear`` whose rows do not depend on T or on the other rows (batch invariance).

    Same math and reference loop as ``linear``. Every row is one matrix-vector product
    (BLAS GEMV), never part of a matrix-matrix one: BLAS GEMM picks a different kernel
    and a different rounding for each row count, GEMV computes each output feature from
    its weight row and the input row alone. One row (batch-1 decode) is a GEMV over the
    whole matrix, exactly what ``linear`` does at T = 1, so a drafter core's decode costs
    what the default core's does. Two or more rows (verification, batched decode) are
    GEMVs over fixed chunks of output features (``invariant_chunks``), every row of one
    chunk before the next, so each chunk is read from memory once and from cache by the
    other rows. That a chunk's GEMV gives the same f32 values as the whole matrix's is a
    property of the BLAS checked by tests/tools/kernels/test_linear_invariant.py (and by
    the real-model greedy identity tests); decode and speculative graphs of cores with
    a drafter use this op, so a verified position's logits equal the decode program's bit
    for bit (the specification, "Complete speculative generation": greedy output unchanged).

    Args: as ``linear``.
    """
    w = weight[:N, :K]
    if T == 1:
        np.dot(w, x[0, :K], out=out[0, :N])
        return
    rows = [x[t, :K] for t in range(T)]
    for start, stop in invariant_chunks(N, K):
        chunk = w[start:stop]
        for t, row in enumerate(rows):
            np.dot(chunk, row, out=out[t, start:stop])
