"""Decode attention split over the context (flash-decoding), in two launches.

``attention_decode_split`` computes, for each row, query head and context split, the
softmax statistics of that split alone; ``attention_decode_merge`` combines the splits.
Together they equal ``attention_decode`` (up to f32 rounding): long contexts get
``B x H x NS`` programs on the GPU instead of ``B x H``, each streaming at most ``SPLIT``
cached positions.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

# Running maximum of an empty split: finite, so merging never computes inf - inf.
EMPTY_MAX = np.float32(-1.0e30)


def attention_decode_split(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    part_ml: NDArray[np.float32],
    part_o: NDArray[np.float32],
    B: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    NS: int,
    SPLIT: int,
    scale: float,
) -> None:
    """Per-split softmax statistics of one-token-per-row attention.

    Reference loop::

        for b, h, sp in product(range(B), range(H), range(NS)):
            part_ml[b, h, sp] = (EMPTY_MAX, 0); part_o[b, h, sp] = 0
            if slot[b] < 0: continue
            lo, hi = sp * SPLIT, min((sp + 1) * SPLIT, positions[b] + 1)
            if lo >= hi: continue
            s_j = dot(scale * q[b, h], K[j])   for j in lo..hi-1   (K, V as in attention_decode)
            m = max(s_j); e_j = exp(s_j - m)
            part_ml[b, h, sp] = (m, sum(e_j)); part_o[b, h, sp] = sum(e_j * V[j])

    Args:
        qkv: ``[B, (H + 2*KVH) * HD]`` f32 (after RoPE).
        positions: ``[B]`` i32 query positions.
        slot: ``[B]`` i32 physical request rows, < 0 for padding.
        page_table: ``[S, MP]`` i32.
        k_cache: ``[P, PT, KVH, HD]`` f32.
        v_cache: ``[P, PT, KVH, HD]`` f32.
        part_ml: ``[B, H, NS, 2]`` f32 (split max, split sum of exponentials), written.
        part_o: ``[B, H, NS, HD]`` f32 unnormalized split outputs, written (zeros for
            an empty split here; the GPU's live-split layout leaves those unwritten, as
            ``attention_decode_merge`` never reads them).
        B: rows. MP: page-table width. PT: tokens per page.
        H: query heads. KVH: key/value heads. HD: head dim.
        NS: splits per row. SPLIT: context positions per split.
        scale: score multiplier.

    Raises:
        IndexError: a position beyond the page table or beyond ``NS * SPLIT`` (misuse).
    """
    G = H // KVH
    ml = part_ml[:B, :H, :NS]
    po = part_o[:B, :H, :NS]
    ml[..., 0] = EMPTY_MAX
    ml[..., 1] = 0.0
    po[...] = 0.0
    rows = np.flatnonzero(slot[:B] >= 0)
    if rows.size == 0:
        return
    n = rows.size
    ctx = positions[rows].astype(np.int64) + 1  # [n]
    worst = int(ctx.max())
    if (worst + PT - 1) // PT > MP or worst > NS * SPLIT:
        raise IndexError(f"position {worst - 1} exceeds the page table or the splits "
                         f"(MP={MP}, PT={PT}, NS={NS}, SPLIT={SPLIT})")
    # All live rows at once, padded to whole splits of the longest context. Padded
    # positions gather the row's own position 0 (always written) and score -inf, so
    # they weigh nothing; a split past a row's context keeps (EMPTY_MAX, 0) and zeros.
    n_split = (worst + SPLIT - 1) // SPLIT
    j = np.arange(n_split * SPLIT)
    valid = j[None, :] < ctx[:, None]  # [n, L]
    jc = np.where(valid, j[None, :], 0)
    pages = page_table[slot[rows][:, None], jc // PT].astype(np.int64)
    idx = pages * PT + jc % PT  # [n, L]
    # Every product has the fixed shape of one split ([G, HD] x [HD, SPLIT], then
    # [G, SPLIT] x [SPLIT, HD]), so a row's result depends on neither the other rows nor
    # the longest context in the batch: decode and verification rows agree bit for bit.
    k = k_cache.reshape(-1, KVH, HD)[idx].reshape(n, n_split, SPLIT, KVH, HD)
    k = k.transpose(0, 3, 1, 4, 2)  # [n, KVH, n_split, HD, SPLIT]
    v = v_cache.reshape(-1, KVH, HD)[idx].reshape(n, n_split, SPLIT, KVH, HD)
    vs = v.transpose(0, 3, 1, 2, 4)  # [n, KVH, n_split, SPLIT, HD]
    q = qkv[rows, : H * HD].reshape(n, KVH, 1, G, HD) * np.float32(scale)
    scores = np.matmul(q, k)  # [n, KVH, n_split, G, SPLIT]
    valid_s = valid.reshape(n, 1, n_split, 1, SPLIT)
    scores = np.where(valid_s, scores, np.float32(-np.inf))
    m = scores.max(axis=-1)  # [n, KVH, n_split, G]; -inf for splits past the context
    live = np.isfinite(m)
    e = np.exp(scores - np.where(live, m, 0.0)[..., None])
    o = np.matmul(e, vs)  # [n, KVH, n_split, G, HD]
    m = m.transpose(0, 1, 3, 2)  # [n, KVH, G, n_split]
    live = live.transpose(0, 1, 3, 2)
    esum = e.sum(axis=-1).transpose(0, 1, 3, 2)
    o = o.transpose(0, 1, 3, 2, 4)  # [n, KVH, G, n_split, HD]
    ml[rows, :, :n_split, 0] = np.where(live, m, EMPTY_MAX).reshape(n, H, n_split)
    ml[rows, :, :n_split, 1] = esum.reshape(n, H, n_split)
    po[rows, :, :n_split] = o.reshape(n, H, n_split, HD)


def attention_decode_merge(
    part_ml: NDArray[np.float32],
    part_o: NDArray[np.float32],
    slot: NDArray[np.int32],
    out: NDArray[np.float32],
    B: int,
    H: int,
    HD: int,
    NS: int,
) -> None:
    """Combine the splits of ``attention_decode_split`` into the attention output.

    Reference loop::

        for b, h in product(range(B), range(H)):
            if slot[b] < 0: out[b, h] = 0; continue
            M = max(part_ml[b, h, :, 0]); w_s = exp(part_ml[b, h, s, 0] - M)
            out[b, h] = sum(w_s * part_o[b, h, s]    for s with part_ml[b, h, s, 1] != 0)
                        / sum(w_s * part_ml[b, h, s, 1])

    Args:
        part_ml: ``[B, H, NS, 2]`` f32.
        part_o: ``[B, H, NS, HD]`` f32; an empty split's (sum of exponentials 0) is not
            read (its contribution is zero by contract, whatever the buffer holds).
        slot: ``[B]`` i32, < 0 for padding.
        out: ``[B, H * HD]`` f32, written (zeros for padding rows).
        B: rows. H: query heads. HD: head dim. NS: splits per row.
    """
    o = out[:B, : H * HD]
    o[...] = 0.0
    rows = np.flatnonzero(slot[:B] >= 0)
    if rows.size == 0:
        return
    m = part_ml[rows, :H, :NS, 0]  # [n, H, NS]
    w = np.exp(m - m.max(axis=-1, keepdims=True))
    live = part_ml[rows, :H, :NS, 1] != 0
    num = np.einsum("nhs,nhsd->nhd", w, np.where(live[..., None], part_o[rows, :H, :NS], 0))
    den = np.einsum("nhs,nhs->nh", w, part_ml[rows, :H, :NS, 1])
    o[rows] = (num / den[..., None]).reshape(rows.size, H * HD)


def _chosen_splits(choice: NDArray[np.int32], NS: int) -> int:
    ns = int(choice.reshape(-1)[0])
    if not 1 <= ns <= NS:
        raise ValueError(f"tuned split count {ns} outside [1, {NS}] (the tuning producer "
                         "writes one of its candidates)")
    return ns


def tuned_split_length(NS: int, SPLIT: int, ns: int) -> int:
    """Positions per split when ``ns`` of the ``NS`` captured splits cover the context:
    ``ceil(NS * SPLIT / ns)`` (``ns = NS`` gives ``SPLIT``)."""
    return -(-NS * SPLIT // ns)


def attention_decode_split_tuned(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    part_ml: NDArray[np.float32],
    part_o: NDArray[np.float32],
    choice: NDArray[np.int32],
    B: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    NS: int,
    SPLIT: int,
    scale: float,
) -> None:
    """``attention_decode_split`` with the split count read from a tuned buffer.

    The grid is captured at the maximum count ``NS`` (splits of ``SPLIT`` positions);
    ``ns = choice[0]`` (written at startup by the decode-split tuning producer) splits the
    same ``NS * SPLIT`` positions into ``ns`` splits of ``tuned_split_length(NS, SPLIT, ns)``
    positions. Splits ``>= ns`` do nothing (on the GPU those programs exit at once);
    ``part_ml``/``part_o`` keep their ``NS``-split layout.

    Reference loop::

        ns = choice[0]
        attention_decode_split(..., NS=ns, SPLIT=ceil(NS * SPLIT / ns))   # writes splits < ns

    Args:
        choice: ``[1]`` (or more) i32; element 0 is the split count, in ``[1, NS]``.
        Others: as ``attention_decode_split``.

    Raises:
        ValueError: a split count outside ``[1, NS]``.
        IndexError: as ``attention_decode_split``.
    """
    ns = _chosen_splits(choice, NS)
    attention_decode_split(qkv, positions, slot, page_table, k_cache, v_cache, part_ml, part_o,
                           B, MP, PT, H, KVH, HD, ns, tuned_split_length(NS, SPLIT, ns), scale)


def attention_decode_merge_tuned(
    part_ml: NDArray[np.float32],
    part_o: NDArray[np.float32],
    slot: NDArray[np.int32],
    choice: NDArray[np.int32],
    out: NDArray[np.float32],
    B: int,
    H: int,
    HD: int,
    NS: int,
) -> None:
    """``attention_decode_merge`` of the first ``choice[0]`` splits (see
    ``attention_decode_split_tuned``).

    Raises:
        ValueError: a split count outside ``[1, NS]``.
    """
    attention_decode_merge(part_ml, part_o, slot, out, B, H, HD, _chosen_splits(choice, NS))


def attention_decode_fused(
    qkv: NDArray[np.float32],
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    k_cache: NDArray[np.float32],
    v_cache: NDArray[np.float32],
    part_ml: NDArray[np.float32],
    part_o: NDArray[np.float32],
    arrivals: NDArray[np.int32],
    out: NDArray[np.float32],
    B: int,
    MP: int,
    PT: int,
    H: int,
    KVH: int,
    HD: int,
    NS: int,
    SPLIT: int,
    scale: float,
) -> None:
    """``attention_decode_split`` then ``attention_decode_merge``, as one launch on the GPU
    (the program that completes a row's last split merges it; a row whose context fits
    one split is written by that split directly).

    Reference loop::

        attention_decode_split(qkv, ..., part_ml, part_o, B, MP, PT, H, KVH, HD, NS, SPLIT, scale)
        attention_decode_merge(part_ml, part_o, slot, out, B, H, HD, NS)

    Args:
        part_ml, part_o: as ``attention_decode_split``'s, used as workspace: their
            contents after the launch are not part of the result (the GPU kernel writes
            only the partials of rows with more than one live split).
        arrivals: ``[B, KVH]`` (or more) i32 per-(row, kv head) split counters of the GPU
            kernel; zero before the launch and left zero.
        out: ``[B, H * HD]`` f32, written (zeros for padding rows).
        Others: as ``attention_decode_split``.

    Raises:
        ValueError: `arrivals` is not all zero (a launch that did not complete, or a
            buffer shared with something else).
        IndexError: as ``attention_decode_split``.
    """
    if arrivals.reshape(-1)[: B * KVH].any():
        raise ValueError("attention_decode_fused: arrivals must be zero before a launch")
    attention_decode_split(qkv, positions, slot, page_table, k_cache, v_cache, part_ml, part_o,
                           B, MP, PT, H, KVH, HD, NS, SPLIT, scale)
    attention_decode_merge(part_ml, part_o, slot, out, B, H, HD, NS)
