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


# Rows per fixed-shape block of ``linear_invariant``: one BLAS call per 8 rows.
INVARIANT_ROWS = 8


def linear_invariant(
    x: NDArray[np.float32],
    weight: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    N: int,
    K: int,
) -> None:
    """``linear`` whose rows do not depend on T or on the other rows (batch invariance).

    Same math and reference loop as ``linear``. BLAS picks a different kernel (and so a
    different rounding) for each row count, so the rows go through fixed 8-row blocks
    (the last one zero-padded): a row gets the same f32 result in a 1-row decode and in
    a 32-row verification. Decode and speculative graphs of cores with a drafter use it,
    so a verified position's logits equal the decode program's bit for bit
    (model-contract.md, "Complete speculative generation": greedy output unchanged).

    Args: as ``linear``.
    """
    w = weight[:N, :K].T
    block = np.zeros((INVARIANT_ROWS, K), np.float32)
    for start in range(0, T, INVARIANT_ROWS):
        rows = min(INVARIANT_ROWS, T - start)
        if rows == INVARIANT_ROWS:
            out[start:start + rows, :N] = x[start:start + rows, :K] @ w
        else:
            block[:rows] = x[start:start + rows, :K]
            block[rows:] = 0.0
            out[start:start + rows, :N] = (block @ w)[:rows]
