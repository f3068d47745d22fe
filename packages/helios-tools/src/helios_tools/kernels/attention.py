"""Causal paged attention over the KV cache (prefill chunks and one-token decode).

Invariant: ``kv_write`` has already stored every key/value the query may see, so a token at
position ``p`` of physical row ``s`` attends to cache positions ``0..p`` of row ``s`` only,
and the attention of one token never depends on another row or on padding.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

# Query tokens per block in prefill: bounds the [KVH, block*G, ctx] score tensor.
_PREFILL_BLOCK_TOKENS = 128


def _context_index(
    page_rows: NDArray[np.int32], ctx: NDArray[np.int64], length: int, PT: int
) -> NDArray[np.int64]:
    """Flat cache token index ``page * PT + offset`` for positions ``0..length-1``.

    ``page_rows``: [B, MP] page ids of each physical row; ``ctx``: [B] valid tokens. Positions
    at or past a row's ``ctx`` point at that row's position 0 (always written) so a gather
    never reads a page the request does not own; the mask zeroes their weight.
    """
    j = np.arange(length, dtype=np.int64)
    pages = page_rows[:, j // PT].astype(np.int64)  # [B, L]
    idx = pages * PT + (j % PT)[None, :]
    return np.where(j[None, :] < ctx[:, None], idx, idx[:, :1])


def _softmax_masked(scores: NDArray[np.float32], visible: NDArray[np.bool_]) -> NDArray[np.float32]:
    # scores and visible broadcast over [..., L]; every query sees at least position 0
    s = np.where(visible, scores, np.float32(-np.inf))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def attention_prefill(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    R: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    scale: float,
) -> None:
    """Causal GQA attention of packed prefill tokens over their requests' paged caches.

    Earlier chunks of a request are already in the cache, so chunked prefill equals
    one-shot prefill. Query head ``h`` reads kv head ``h // (H // KVH)``.

    Reference loop::

        for t in range(T):
            r = token_row[t]
            if r < 0 or slot[r] < 0:
                out[t] = 0; continue
            s, p = slot[r], positions[t]
            for h in range(H):
                q = qkv[t, h*HD:(h+1)*HD]
                kh = h // (H // KVH)
                K = [k_cache[page_table[s, j // PT], j % PT, kh] for j in range(p + 1)]
                V = [v_cache[page_table[s, j // PT], j % PT, kh] for j in range(p + 1)]
                w = softmax([scale * dot(q, K[j]) for j in range(p + 1)])   # f32, max-subtracted
                out[t, h*HD:(h+1)*HD] = sum(w[j] * V[j] for j in range(p + 1))

    Args:
        qkv: ``[T, (H + 2*KVH) * HD]`` f32 (after RoPE; only q heads are read).
        positions: ``[T]`` i32 token positions.
        token_row: ``[T]`` i32 submission row per packed token, < 0 for padding.
        slot: ``[R]`` i32 physical request row per submission row, < 0 for padding.
        page_table: ``[S, MP]`` i32 page ids per physical request row.
        k_cache: ``[P, PT, KVH, HD]`` f32.
        v_cache: ``[P, PT, KVH, HD]`` f32.
        out: ``[T, H * HD]`` f32, written (zeros for padding tokens).
        T: packed tokens.
        R: submission rows.
        MP: page-table width.
        PT: tokens per page.
        H: query heads.
        KVH: key/value heads.
        HD: head dim.
        scale: score multiplier, usually ``HD ** -0.5``.
    """
    _prefill(qkv, positions, token_row, slot, page_table, k_cache, v_cache, out, T, R, MP,
             PT, H, KVH, HD, 0, scale)


def attention_prefill_window(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    out: NDArray[np.float32],
    T: int,
    R: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    W: int,
    scale: float,
) -> None:
    """``attention_prefill`` over a sliding window: the token at position ``p`` attends to
    positions ``max(0, p - W + 1)..p`` only (the specification's sliding-window history
    regions: a local layer sees the last ``W`` tokens, itself included).

    Reference loop: ``attention_prefill``'s, with ``range(p + 1)`` replaced by
    ``range(max(0, p - W + 1), p + 1)``. The page-table entries of pages wholly behind
    every query's window are never read (they may name pages returned to the pool).

    Args: as ``attention_prefill``, plus ``W`` (i32 >= 1): the window in tokens.
    """
    _prefill(qkv, positions, token_row, slot, page_table, k_cache, v_cache, out, T, R, MP,
             PT, H, KVH, HD, W, scale)


def _prefill(qkv, positions, token_row, slot, page_table, k_cache, v_cache, out, T, R, MP,
             PT, H, KVH, HD, W, scale) -> None:
    """Both prefill attentions (``W`` = 0: the whole causal context)."""
    G = H // KVH
    o = out[:T, : H * HD]
    o[...] = 0.0
    rows = token_row[:T].astype(np.int64)
    real = np.flatnonzero(rows >= 0)
    if real.size == 0:
        return
    real = real[slot[:R][rows[real]] >= 0]
    order = real[np.argsort(rows[real], kind="stable")]  # packed tokens grouped by row
    bounds = np.flatnonzero(np.diff(rows[order])) + 1
    k_flat = k_cache.reshape(-1, KVH, HD)
    v_flat = v_cache.reshape(-1, KVH, HD)
    sc = np.float32(scale)
    for toks in np.split(order, bounds):  # one request row at a time
        s = int(slot[rows[toks[0]]])
        pos = positions[toks].astype(np.int64)  # [n]
        ctx = int(pos.max()) + 1
        if (ctx + PT - 1) // PT > MP:
            raise IndexError(f"position {ctx - 1} exceeds the page table (MP={MP}, PT={PT})")
        # A window starts the gather at the first page any query of the row still sees.
        first = max(0, int(pos.min()) - W + 1) // PT * PT if W else 0
        idx = _context_index(page_table[s : s + 1, :MP], np.array([ctx]), ctx, PT)[0][first:]
        k = k_flat[idx].transpose(1, 2, 0)  # [KVH, HD, ctx - first]
        v = v_flat[idx].transpose(1, 0, 2)  # [KVH, ctx - first, HD]
        kpos = np.arange(first, ctx)
        for b0 in range(0, toks.size, _PREFILL_BLOCK_TOKENS):
            tb = toks[b0 : b0 + _PREFILL_BLOCK_TOKENS]
            n = tb.size
            # q: [n, H*HD] -> [KVH, n*G, HD] so one matmul per kv head covers its G q heads
            q = qkv[tb, : H * HD].reshape(n, KVH, G, HD).transpose(1, 0, 2, 3)
            q = q.reshape(KVH, n * G, HD) * sc
            scores = np.matmul(q, k).reshape(KVH, n, G, ctx - first)
            qpos = pos[b0 : b0 + n, None]
            visible = kpos[None, :] <= qpos
            if W:
                visible &= kpos[None, :] > qpos - W
            w = _softmax_masked(scores, visible[None, :, None, :]).reshape(KVH, n * G,
                                                                           ctx - first)
            att = np.matmul(w, v)  # [KVH, n*G, HD]
            o[tb] = att.reshape(KVH, n, G, HD).transpose(1, 0, 2, 3).reshape(n, H * HD)


def attention_decode(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    out: NDArray[np.float32],
    B: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    scale: float,
) -> None:
    """One-token-per-row attention: ``attention_prefill`` with ``token_row[b] = b``.

    Reference loop::

        for b in range(B):
            if slot[b] < 0:
                out[b] = 0; continue
            # exactly the prefill loop body with t = b, r = b, s = slot[b],
            # p = positions[b] (context length p + 1)

    Args:
        qkv: ``[B, (H + 2*KVH) * HD]`` f32 (after RoPE; only q heads are read).
        positions: ``[B]`` i32 position of each row's query token.
        slot: ``[B]`` i32 physical request row, < 0 for padding.
        page_table: ``[S, MP]`` i32 page ids per physical request row.
        k_cache: ``[P, PT, KVH, HD]`` f32.
        v_cache: ``[P, PT, KVH, HD]`` f32.
        out: ``[B, H * HD]`` f32, written (zeros for padding rows).
        B: batch rows.
        MP: page-table width.
        PT: tokens per page.
        H: query heads.
        KVH: key/value heads.
        HD: head dim.
        scale: score multiplier, usually ``HD ** -0.5``.
    """
    _decode(qkv, positions, slot, page_table, k_cache, v_cache, out, B, MP, PT, H, KVH, HD,
            0, scale)


def attention_decode_window(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    out: NDArray[np.float32],
    B: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    W: int,
    scale: float,
) -> None:
    """``attention_decode`` over a sliding window of ``W`` tokens: the row at position
    ``p`` attends to positions ``max(0, p - W + 1)..p`` (``attention_prefill_window``'s
    rule; page-table entries wholly behind the window are never read).

    Args: as ``attention_decode``, plus ``W`` (i32 >= 1): the window in tokens.
    """
    _decode(qkv, positions, slot, page_table, k_cache, v_cache, out, B, MP, PT, H, KVH, HD,
            W, scale)


def _decode(qkv, positions, slot, page_table, k_cache, v_cache, out, B, MP, PT, H, KVH, HD,
            W, scale) -> None:
    """Both decode attentions (``W`` = 0: the whole causal context)."""
    G = H // KVH
    o = out[:B, : H * HD]
    o[...] = 0.0
    rows = np.flatnonzero(slot[:B] >= 0)
    if rows.size == 0:
        return
    n = rows.size
    ctx = positions[rows].astype(np.int64) + 1  # [n]
    length = int(ctx.max())
    if (length + PT - 1) // PT > MP:
        raise IndexError(f"position {length - 1} exceeds the page table (MP={MP}, PT={PT})")
    # All live rows in one batched gather, padded to the longest context and masked; a
    # window gathers from the first page the earliest row still sees (entries before it
    # may name pages returned to the pool) and masks positions behind each row's window.
    first = max(0, int(ctx.min()) - W) // PT * PT if W else 0
    idx = _context_index(page_table[slot[rows], :MP], ctx, length, PT)  # [n, length]
    if W:  # positions outside a row's window read its newest token (masked below): the
        # position 0 a padded gather otherwise reads may lie on a page returned to the pool
        newest = np.take_along_axis(idx, (ctx - 1)[:, None], axis=1)
        j = np.arange(length)[None, :]
        idx = np.where((j >= ctx[:, None] - W) & (j < ctx[:, None]), idx, newest)
    idx = idx[:, first:]
    k = k_cache.reshape(-1, KVH, HD)[idx].transpose(0, 2, 3, 1)  # [n, KVH, HD, L]
    v = v_cache.reshape(-1, KVH, HD)[idx].transpose(0, 2, 1, 3)  # [n, KVH, L, HD]
    q = qkv[rows, : H * HD].reshape(n, KVH, G, HD) * np.float32(scale)
    scores = np.matmul(q, k)  # [n, KVH, G, L]
    kpos = np.arange(first, length)[None, :]
    visible = kpos < ctx[:, None]
    if W:
        visible &= kpos >= ctx[:, None] - W
    w = _softmax_masked(scores, visible[:, None, None, :])
    o[rows] = np.matmul(w, v).reshape(n, H * HD)
