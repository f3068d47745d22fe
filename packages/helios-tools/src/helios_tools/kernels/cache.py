"""Paged KV cache writes."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def kv_write(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    T: int,
    R: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
) -> None:
    """Scatter each real token's key and value heads into its request's cache pages.

    Page tables are indexed by physical request row (``slot``); ``token_row`` maps a packed
    token to its submission row.

    Reference loop::

        for t in range(T):
            r = token_row[t]
            if r < 0 or slot[r] < 0:
                continue                                   # padding: write nothing
            s, pos = slot[r], positions[t]
            page = page_table[s, pos // PT]
            k_cache[page, pos % PT] = qkv[t, H*HD:(H+KVH)*HD].reshape(KVH, HD)
            v_cache[page, pos % PT] = qkv[t, (H+KVH)*HD:(H+2*KVH)*HD].reshape(KVH, HD)

    Args:
        qkv: ``[T, (H + 2*KVH) * HD]`` f32 fused projections (after RoPE).
        positions: ``[T]`` i32 token positions.
        token_row: ``[T]`` i32 submission row per packed token, < 0 for padding.
        slot: ``[R]`` i32 physical request row per submission row, < 0 for padding.
        page_table: ``[S, MP]`` i32 page ids per physical request row.
        k_cache: ``[P, PT, KVH, HD]`` f32, written at the real tokens' positions.
        v_cache: ``[P, PT, KVH, HD]`` f32, likewise.
        T: packed tokens.
        R: submission rows.
        MP: page-table width.
        PT: tokens per page.
        H: query heads.
        KVH: key/value heads.
        HD: head dim.

    Raises:
        IndexError: if a real token's position is negative or beyond its page table.
    """
    rows = token_row[:T]
    t_idx = np.flatnonzero(rows >= 0)
    s = slot[:R][rows[t_idx]]
    keep = s >= 0
    t_idx, s = t_idx[keep], s[keep]
    if t_idx.size == 0:
        return
    pos = positions[t_idx].astype(np.int64)
    page_col = pos // PT
    if pos.min() < 0 or page_col.max() >= MP:
        raise IndexError(f"positions {int(pos.min())}..{int(pos.max())} outside MP={MP} pages")
    page = page_table[s, page_col]
    off = pos % PT
    k0, v0 = H * HD, (H + KVH) * HD
    k_cache[page, off] = qkv[t_idx, k0:v0].reshape(-1, KVH, HD)
    v_cache[page, off] = qkv[t_idx, v0 : v0 + KVH * HD].reshape(-1, KVH, HD)
