"""Token-row gathers: the input embedding and the last token of each request."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def embedding(
    ids: NDArray[np.int32],
    table: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    D: int,
) -> None:
    """Look up one embedding row per packed token.

    Reference loop::

        for t in range(T):
            if 0 <= ids[t] < V:
                out[t, :] = table[ids[t], :]
            else:                      # padding (-1) or out-of-range id
                out[t, :] = 0

    Args:
        ids: ``[T]`` i32 token ids (packed tokens).
        table: ``[V, D]`` f32 embedding table.
        out: ``[T, D]`` f32, written.
        T: token rows.
        D: hidden size.
    """
    V = table.shape[0]
    tok = ids[:T]
    valid = (tok >= 0) & (tok < V)
    o = out[:T, :D]
    o[...] = table[np.where(valid, tok, 0), :D]
    o[~valid] = 0.0


def gather_last(
    x: NDArray[np.float32],
    query_length: NDArray[np.int32],
    out: NDArray[np.float32],
    T: int,
    R: int,
    D: int,
) -> None:
    """Copy each request's last packed token row (the one whose logits are sampled).

    Rows are packed in submission order; a row with ``query_length <= 0`` occupies no
    tokens and its output is zeros.

    Reference loop::

        end = 0
        for r in range(R):
            n = max(query_length[r], 0)
            end += n
            out[r, :] = x[end - 1, :] if n > 0 else 0

    Args:
        x: ``[T, D]`` f32 packed token activations.
        query_length: ``[R]`` i32 tokens per submission row.
        out: ``[R, D]`` f32, written.
        T: packed token capacity.
        R: submission rows.
        D: row width.

    Raises:
        IndexError: if the lengths sum past ``T``.
    """
    n = np.maximum(query_length[:R].astype(np.int64), 0)
    last = np.cumsum(n) - 1  # [R] packed-token index of each row's last token
    if R and last[-1] >= T:
        raise IndexError(f"query lengths sum to {last[-1] + 1} > packed capacity {T}")
    real = n > 0
    o = out[:R, :D]
    o[...] = x[np.where(real, last, 0), :D]
    o[~real] = 0.0
