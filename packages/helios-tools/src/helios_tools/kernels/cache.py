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
    t_idx, page, off = kv_destinations(positions, token_row, slot, page_table, T, R, MP, PT)
    k0, v0 = H * HD, (H + KVH) * HD
    k_cache[page, off] = qkv[t_idx, k0:v0].reshape(-1, KVH, HD)
    v_cache[page, off] = qkv[t_idx, v0 : v0 + KVH * HD].reshape(-1, KVH, HD)


def kv_destinations(positions: NDArray[np.int32], token_row: NDArray[np.int32],
                    slot: NDArray[np.int32], page_table: NDArray[np.int32], T: int, R: int,
                    MP: int, PT: int
                    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """The real tokens of a cache write and where each lands: ``(packed token index,
    page id, offset in the page)``, three ``[n]`` int64 arrays (n = 0 when every token is
    padding). ``kv_write``'s index rule, shared by its e4m3 form (kernels/kv_fp8.py).

    Raises:
        IndexError: if a real token's position is negative or beyond its page table.
    """
    rows = token_row[:T]
    t_idx = np.flatnonzero(rows >= 0)
    s = slot[:R][rows[t_idx]]
    keep = s >= 0
    t_idx, s = t_idx[keep], s[keep]
    if t_idx.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    pos = positions[t_idx].astype(np.int64)
    page_col = pos // PT
    if pos.min() < 0 or page_col.max() >= MP:
        raise IndexError(f"positions {int(pos.min())}..{int(pos.max())} outside MP={MP} pages")
    return t_idx.astype(np.int64), page_table[s, page_col].astype(np.int64), pos % PT


def row_copy(
    src: NDArray[np.float32],
    dst: NDArray[np.float32],
    src_rows: NDArray[np.int32],
    dst_rows: NDArray[np.int32],
    R: int,
    ROW: int,
) -> None:
    """Copy whole rows of one storage plane to rows of another (TRANSFER programs: page ->
    continuation row for a snapshot, continuation or host row -> private page for a
    restore, page <-> host row for the host tier). Specification: "Attention histories
    and cache policy" (restore copies continuation payloads to private writable pages).

    A row is the leading-axis slice of a plane: one page of a cache plane
    (``[PT, KVH, HD]`` = ``ROW`` elements), one continuation row or one host-tier row of
    the same shape.

    Reference loop::

        for r in range(R):
            s, d = src_rows[r], dst_rows[r]
            if s < 0 or d < 0:
                continue                       # padding: copy nothing
            dst[d] = src[s]

    Rows of one launch are distinct destinations; every source is read before any
    destination is written (a launch never copies a row onto a row it also reads).

    Args:
        src: ``[Ns, ...]`` f32 plane, ``ROW`` elements per leading index.
        dst: ``[Nd, ...]`` f32 plane of the same row shape.
        src_rows: ``[R]`` i32 source row per submission row, < 0 for padding.
        dst_rows: ``[R]`` i32 destination row per submission row, < 0 for padding.
        R: submission rows (the program's captured batch capacity).
        ROW: f32 elements per row.

    Raises:
        IndexError: a real row outside its plane.
    """
    s = src_rows[:R].astype(np.int64)
    d = dst_rows[:R].astype(np.int64)
    keep = (s >= 0) & (d >= 0)
    s, d = s[keep], d[keep]
    if s.size == 0:
        return
    flat_src = src.reshape(-1, ROW)
    flat_dst = dst.reshape(-1, ROW)
    if s.max() >= flat_src.shape[0] or d.max() >= flat_dst.shape[0]:
        raise IndexError(f"rows {int(s.max())} / {int(d.max())} outside planes of "
                         f"{flat_src.shape[0]} / {flat_dst.shape[0]} rows")
    flat_dst[d] = flat_src[s]
