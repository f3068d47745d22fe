"""The chunked sampler: ``sample_biased`` as three launches that split each row's
vocabulary over many programs (docs/gpu.md, "Sampling at greedy speed").

``sample_biased`` runs one program per row that sweeps the whole vocabulary once per
bisection probe (about 68 sweeps for a top-k + top-p row). Here:

1. ``sample_chunks`` (grid ``R x P``, ``P = ceil(V / C)`` chunks of ``C`` ids): each chunk
   computes its biased, penalized, masked logits once and writes its greedy maximum and
   first arg-max; for rows with temperature > 0 and ``0 < top_k <= KM`` (and
   ``top_k < V``) also its local top-k of the scaled logits (ties: lower ids) as
   order-preserving keys and ids, ascending by id, padded with ``KEY_PAD`` / -1.
2. ``sample_merge`` (grid ``R``): the global greedy arg-max; for those top-k rows the exact
   top-k from the ``P x KM`` candidates (the global top-k is inside the union of the
   chunks' local ones), softmax, top-p, min-p and the seeded race over at most ``KM``
   ids. Every other sampling row (no top-k, top-k above KM) is marked ``UNRESOLVED``.
3. ``sample_rest`` (grid ``R``): ``sample_biased``'s row for the rows still marked
   ``UNRESOLVED``; the others return at once.

The three in order have exactly ``sample_biased``'s outputs (``sampled`` and the
histogram counts), with the same arithmetic: the candidates' scaled logits are recovered
bit for bit from their keys, so the softmax, top-p, min-p and race run on the same f32
values in the same order as ``sample_biased``'s reference.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .sampling import _allowed, _processed, _race, _top_k, _truncate, sample_biased

# Captured geometry: ids per chunk (one GPU block) and candidates kept per chunk (the
# largest top_k resolved without the bisection kernel).
CHUNK = 2048
CANDIDATES = 64
# ``sampled`` value of a row that ``sample_merge`` leaves to ``sample_rest``.
UNRESOLVED = -2
# Candidate-key padding: below every key of a finite or infinite f32.
KEY_PAD = -(2**31)


def order_key(x: NDArray[np.float32]) -> NDArray[np.int32]:
    """Order-preserving int32 keys of f32 values (``a < b`` <=> ``key(a) < key(b)``);
    its own inverse on the bit patterns (``key_value``)."""
    b = np.ascontiguousarray(x, np.float32).view(np.int32)
    return np.where(b >= 0, b, b ^ np.int32(0x7FFFFFFF)).astype(np.int32)


def key_value(key: NDArray[np.int32]) -> NDArray[np.float32]:
    """The f32 values of order keys (the inverse of ``order_key``)."""
    k = np.asarray(key, np.int32)
    return np.where(k >= 0, k, k ^ np.int32(0x7FFFFFFF)).astype(np.int32).view(np.float32)


def uses_candidates(temperature: float, top_k: int, V: int, KM: int) -> bool:
    """Whether a row's draw is resolved from the chunks' top-k candidates."""
    return temperature > 0.0 and 0 < top_k <= KM and top_k < V


def sample_chunks(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    temperature: NDArray[np.float32],
    top_k: NDArray[np.int32],
    presence: NDArray[np.float32],
    frequency: NDArray[np.float32],
    repetition: NDArray[np.float32],
    histogram: NDArray[np.int32],
    logit_bias: NDArray[np.float32],
    use_bias: NDArray[np.int32],
    grammar_mask: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    chunk_max: NDArray[np.float32],
    chunk_arg: NDArray[np.int32],
    cand_key: NDArray[np.int32],
    cand_id: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
    C: int,
    KM: int,
) -> None:
    """Per row and chunk of ``C`` ids: the greedy maximum and the local top-k candidates.

    Reference loop::

        for r in range(R):
            if slot[r] < 0: continue                       # padding writes nothing
            z = logits[r] + bias, penalties, mask          # as sample_biased, f32
            for c in range(P):                             # P = ceil(V / C)
                ids = c*C .. min((c+1)*C, V) - 1
                chunk_max[r, c] = max(z[ids]); chunk_arg[r, c] = first arg-max in ids
                if uses_candidates(temperature[r], top_k[r], V, KM):
                    zt = z[ids] / temperature[r]
                    keep = the min(top_k, len(ids)) largest zt (ties: lower ids)
                    cand_key[r, c*KM:(c+1)*KM] = order_key(zt[keep]), then KEY_PAD
                    cand_id[r, c*KM:(c+1)*KM] = ids[keep] ascending, then -1

    Args:
        logits: ``[R, V]`` f32; slot ``[R]`` i32 (< 0 padding); temperature ``[R]`` f32;
            top_k ``[R]`` i32; presence, frequency, repetition ``[R]`` f32; histogram
            ``[S, V]`` i32 (read); logit_bias ``[S, V]`` f32; use_bias ``[R]`` i32;
            grammar_mask ``[R, W32]`` i32; use_mask ``[R]`` i32: as ``sample_biased``.
        chunk_max: ``[R, P]`` f32, written for live rows.
        chunk_arg: ``[R, P]`` i32, written for live rows.
        cand_key: ``[R, P * KM]`` i32, written for live candidate rows.
        cand_id: ``[R, P * KM]`` i32, written for live candidate rows.
        R: submission rows. V: vocabulary size. W32: mask words per row.
        C: ids per chunk (the GPU kernel's block). KM: candidates kept per chunk.
    """
    P = -(-V // C)
    for r in range(R):
        s = int(slot[r])
        if s < 0:
            continue
        allowed = _allowed(grammar_mask[r, :W32], V) if use_mask[r] else None
        z = _processed(logits[r, :V].astype(np.float32, copy=False), histogram[s, :V],
                       logit_bias[s, :V] if use_bias[r] else None, float(presence[r]),
                       float(frequency[r]), float(repetition[r]), allowed)
        temp, k = float(temperature[r]), int(top_k[r])
        cands = uses_candidates(temp, k, V, KM)
        zt_row = z / np.float32(temp) if cands else None
        for c in range(P):
            lo, hi = c * C, min((c + 1) * C, V)
            part = z[lo:hi]
            best = int(np.argmax(part))
            chunk_max[r, c] = part[best]
            chunk_arg[r, c] = lo + best
            if zt_row is None:
                continue
            zt = zt_row[lo:hi]
            keep = _top_k(zt, min(k, zt.size))
            n = keep.size
            cand_key[r, c * KM:c * KM + n] = order_key(zt[keep])
            cand_key[r, c * KM + n:(c + 1) * KM] = KEY_PAD
            cand_id[r, c * KM:c * KM + n] = lo + keep
            cand_id[r, c * KM + n:(c + 1) * KM] = -1


def sample_merge(
    chunk_max: NDArray[np.float32],
    chunk_arg: NDArray[np.int32],
    cand_key: NDArray[np.int32],
    cand_id: NDArray[np.int32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    sampling_decision: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    min_p: NDArray[np.float32],
    histogram: NDArray[np.int32],
    selected: NDArray[np.int32],
    sampled: NDArray[np.int32],
    R: int,
    V: int,
    P: int,
    KM: int,
) -> None:
    """Resolve each row from its chunks: greedy rows and top-k rows; mark the rest.

    Reference loop::

        for r in range(R):
            if slot[r] < 0: sampled[r] = -1; continue
            best = max(chunk_max[r]); arg = min(chunk_arg[r, c] for c with chunk_max == best)
            if temperature[r] <= 0 or best == -inf:
                tok = arg                                   # greedy (token 0 if all masked)
            elif uses_candidates(temperature[r], top_k[r], V, KM):
                valid = cand_id[r] >= 0                     # ascending ids
                zt = key_value(cand_key[r, valid])          # the scaled logits, exact
                keep = top_k largest zt (ties: lower ids)
                selected[r, :KM] = cand ids kept ascending, then -1
                selected[r, KM:] = their keys, then KEY_PAD
                tok = race over softmax(zt[keep]) after top-p and min-p (sample_biased)
            else:
                sampled[r] = UNRESOLVED; continue           # sample_rest draws it
            sampled[r] = tok
            if sampling_decision[r] != 0: histogram[slot[r], tok] += 1

    Args:
        chunk_max, chunk_arg, cand_key, cand_id: ``sample_chunks``' outputs.
        slot, positions, sampling_decision, seed, temperature, top_p, top_k, min_p:
            as ``sample_biased``.
        histogram: ``[S, V]`` i32, updated for resolved rows.
        selected: ``[R, 2 * KM]`` i32, written for resolved top-k rows (the GPU kernel's
            staging of the winners).
        sampled: ``[R]`` i32, written.
        R: submission rows. V: vocabulary size. P: chunks per row. KM: as sample_chunks.
    """
    for r in range(R):
        s = int(slot[r])
        if s < 0:
            sampled[r] = -1
            continue
        vals = chunk_max[r, :P]
        best = vals.max()
        tok = int(chunk_arg[r, :P][vals == best].min())  # np.argmax's first index
        temp, k = float(temperature[r]), int(top_k[r])
        if temp > 0.0 and np.isfinite(best):
            if not uses_candidates(temp, k, V, KM):
                sampled[r] = UNRESOLVED
                continue
            ids = cand_id[r, :P * KM]
            valid = ids >= 0
            zt = key_value(cand_key[r, :P * KM][valid])
            ids = ids[valid].astype(np.int64)
            keep = _top_k(zt, k)
            cand = ids[keep]
            selected[r, :k] = cand
            selected[r, k:KM] = -1
            selected[r, KM:KM + k] = order_key(zt[keep])
            selected[r, KM + k:2 * KM] = KEY_PAD
            kept, p = _truncate(cand, zt[keep], float(top_p[r]), float(min_p[r]))
            tok = _race(kept, p, int(seed[r, 0]), int(seed[r, 1]), int(positions[r]))
        sampled[r] = tok
        if sampling_decision[r] != 0:
            histogram[s, tok] += 1


def sample_rest(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    sampling_decision: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    min_p: NDArray[np.float32],
    presence: NDArray[np.float32],
    frequency: NDArray[np.float32],
    repetition: NDArray[np.float32],
    histogram: NDArray[np.int32],
    logit_bias: NDArray[np.float32],
    use_bias: NDArray[np.int32],
    grammar_mask: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    sampled: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
) -> None:
    """``sample_biased`` for the rows ``sample_merge`` left ``UNRESOLVED``; every other
    row is unchanged.

    Reference::

        rows = [r for r in range(R) if sampled[r] == UNRESOLVED]
        sample_biased(... those rows only ...)   # writes sampled[r], counts the token

    Args: as ``sample_biased``; ``sampled`` ``[R]`` i32 is read and updated in place.
    """
    rows = np.flatnonzero(sampled[:R] == UNRESOLVED)
    if rows.size == 0:
        return
    sub = np.zeros(rows.size, np.int32)
    sample_biased(logits[rows], slot[rows], positions[rows], sampling_decision[rows],
                  seed[rows], temperature[rows], top_p[rows], top_k[rows], min_p[rows],
                  presence[rows], frequency[rows], repetition[rows], histogram, logit_bias,
                  use_bias[rows], grammar_mask[rows], use_mask[rows], sub, rows.size, V, W32)
    sampled[rows] = sub
