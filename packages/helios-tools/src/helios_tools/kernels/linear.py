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
