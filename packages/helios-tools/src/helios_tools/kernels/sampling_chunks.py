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

from .sampling import (
    _allowed,
    _processed,
    _race,
    _top_k,
    _top_p_prefix,
    _truncate,
    sample_biased,
)

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


# The nucleus form (docs/gpu.md, "Sampling at greedy speed", design point 3): rows with
# no top-k (top_k <= 0 or >= V) and top_p < 1 -- what every OpenAI client sends -- keep
# each chunk's top-KM candidates and its softmax mass too; the merge finds the nucleus
# among the NUCLEUS most probable candidates whenever it provably lies inside them.
NUCLEUS = 256


def uses_nucleus(temperature: float, top_p: float, top_k: int, V: int) -> bool:
    """Whether a row's draw may be resolved from the chunks' nucleus candidates: a
    sampled top-p row with no top-k (``sample_biased`` ignores ``top_k >= V``)."""
    return temperature > 0.0 and top_p < 1.0 and not 0 < top_k < V


def sample_chunks_nucleus(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
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
    chunk_mass: NDArray[np.float32],
    cand_key: NDArray[np.int32],
    cand_id: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
    C: int,
    KM: int,
) -> None:
    """``sample_chunks`` that also serves top-p rows with no top-k (``uses_nucleus``): for
    those each chunk keeps its ``min(KM, len(ids))`` largest scaled logits as candidates
    (as a top-k row with ``k = KM``) and writes its softmax mass relative to its own
    maximum.

    Reference loop (in addition to ``sample_chunks``' for every live row)::

        for r, c with slot[r] >= 0 and uses_nucleus(temperature[r], top_p[r], top_k[r], V):
            zt = z[ids] / temperature[r]                  # z: biased, penalized, masked
            keep = the min(KM, len(ids)) largest zt (ties: lower ids)
            cand_key[r, c*KM:(c+1)*KM] = order_key(zt[keep]), then KEY_PAD
            cand_id[r, c*KM:(c+1)*KM] = ids[keep] ascending, then -1
            chunk_mass[r, c] = sum(exp(zt - max(zt))) in f32  (0 when max(zt) = -inf)

    Args: as ``sample_chunks``, plus ``top_p`` ``[R]`` f32 (after ``temperature``) and
        ``chunk_mass`` ``[R, P]`` f32, written for live nucleus rows (after
        ``chunk_arg``). The chunks' maxima are the rows' ``chunk_max``: the merge scales
        each mass to the row's maximum, so no chunk needs to know it.
    """
    sample_chunks(logits, slot, temperature, top_k, presence, frequency, repetition,
                  histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                  chunk_arg, cand_key, cand_id, R, V, W32, C, KM)
    P = -(-V // C)
    for r in range(R):
        s = int(slot[r])
        if s < 0 or not uses_nucleus(float(temperature[r]), float(top_p[r]), int(top_k[r]),
                                     V):
            continue
        allowed = _allowed(grammar_mask[r, :W32], V) if use_mask[r] else None
        z = _processed(logits[r, :V].astype(np.float32, copy=False), histogram[s, :V],
                       logit_bias[s, :V] if use_bias[r] else None, float(presence[r]),
                       float(frequency[r]), float(repetition[r]), allowed)
        zt_row = z / np.float32(temperature[r])
        for c in range(P):
            lo, hi = c * C, min((c + 1) * C, V)
            zt = zt_row[lo:hi]
            keep = _top_k(order_key(zt), min(KM, zt.size))  # by key, as the kernel
            n = keep.size
            cand_key[r, c * KM:c * KM + n] = order_key(zt[keep])
            cand_key[r, c * KM + n:(c + 1) * KM] = KEY_PAD
            cand_id[r, c * KM:c * KM + n] = lo + keep
            cand_id[r, c * KM + n:(c + 1) * KM] = -1
            top = zt.max()
            with np.errstate(under="ignore", invalid="ignore"):
                e = np.where(zt > -np.inf, np.exp(zt - top), np.float32(0))
            chunk_mass[r, c] = e.sum(dtype=np.float32) if top > -np.inf else 0.0


def nucleus_bound(cand_key: NDArray[np.int32], cand_id: NDArray[np.int32],
                  chosen: NDArray[np.bool_], V: int, P: int, C: int, KM: int) -> int | None:
    """The largest key of one row's ids outside ``chosen`` (a mask over the row's ``P x KM``
    candidate lanes), or None when every id of the row is chosen: the larger of the
    largest unchosen candidate's key and each truncated chunk's (``len(ids) > KM``)
    KM-th key, which bounds every id the chunk did not keep."""
    keys = cand_key[:P * KM].reshape(P, KM)
    valid = cand_id[:P * KM].reshape(P, KM) >= 0
    size = np.minimum(C, V - np.arange(P) * C)
    bounds = [int(keys[c][valid[c]].min()) for c in range(P) if size[c] > KM]
    bounds += [int(k) for k in cand_key[:P * KM][(cand_id[:P * KM] >= 0) & ~chosen]]
    return max(bounds) if bounds else None


def _nucleus_draw(chunk_max, chunk_mass, cand_key, cand_id, r, V, P, C, KM, KN, temp, tp,
                  mp, seed_lo, seed_hi, position) -> int:
    """A nucleus row's token from its chunks, or ``UNRESOLVED`` (see sample_merge_nucleus)."""
    t = np.float32(temp)
    best = chunk_max[r, :P].max()
    zmax = best / t
    tops = chunk_max[r, :P] / t
    with np.errstate(under="ignore", invalid="ignore"):
        scale = np.where(chunk_max[r, :P] > -np.inf, np.exp(tops - zmax), np.float32(0))
    S = (scale * chunk_mass[r, :P]).sum(dtype=np.float32)
    ids = cand_id[r, :P * KM]
    valid = ids >= 0
    keys = cand_key[r, :P * KM]
    lanes = np.flatnonzero(valid)
    # The KN largest candidates (ties: lower ids; lanes are ascending by id per chunk and
    # chunks ascending, so lane order is id order).
    pick = lanes[_top_k(keys[lanes], min(KN, lanes.size))]
    chosen = np.zeros(P * KM, bool)
    chosen[pick] = True
    bound = nucleus_bound(cand_key[r], cand_id[r], chosen, V, P, C, KM)
    zt = key_value(keys[pick])
    with np.errstate(under="ignore"):
        p = np.exp(zt - zmax) / S
    order = np.argsort(-p, kind="stable")  # p descending, ties: lower id (pick ascending)
    n = _top_p_prefix(p, order, np.float32(tp))
    if bound is None:
        n = min(n, pick.size)  # every id of the row is here: sample_biased's own rule
    else:
        with np.errstate(under="ignore"):
            p_out = np.exp(key_value(np.array([bound], np.int32))[0] - zmax) / S
        # Exact only when the nucleus ends strictly above every id left out: then the
        # row's p-descending order starts with these candidates, in this order.
        if n > pick.size or not p[order[n - 1]] > p_out:
            return UNRESOLVED
    keep = np.sort(order[:n])
    cand, p = ids[pick][keep].astype(np.int64), p[keep]
    if mp > 0.0:
        live = p >= np.float32(mp) * p.max()
        cand, p = cand[live], p[live]
    return _race(cand, p, seed_lo, seed_hi, position)


def sample_merge_nucleus(
    chunk_max: NDArray[np.float32],
    chunk_arg: NDArray[np.int32],
    chunk_mass: NDArray[np.float32],
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
    C: int,
    KM: int,
    KN: int,
) -> None:
    """``sample_merge`` that also resolves nucleus rows (``uses_nucleus``) whose nucleus
    provably lies inside their ``KN`` most probable candidates.

    Reference loop for a live nucleus row (greedy, top-k and other rows as
    ``sample_merge``)::

        zmax = max(chunk_max[r]) / T
        S = sum over chunks of exp(chunk_max[r, c] / T - zmax) * chunk_mass[r, c]
        pick = the KN largest candidate keys (ties: lower ids), ascending by id
        p = exp(key_value(pick keys) - zmax) / S        # the row's probabilities, f32
        order = pick by p descending (ties: lower id)
        n = shortest prefix of order whose f32 cumsum >= top_p (as _top_p_prefix)
        bound = largest key outside pick (nucleus_bound), None if pick is the whole row
        if bound is None: n = min(n, len(pick))
        elif n > len(pick) or not p[order[n-1]] > exp(key_value(bound) - zmax) / S:
            sampled[r] = UNRESOLVED; continue           # sample_rest draws it
        tok = race over the first n of order, after min-p (sample_biased)

    When the nucleus ends strictly above the bound, every id left out has a smaller
    probability than every nucleus id (p is non-decreasing in the scaled logit), so the
    row's p-descending order begins with exactly this prefix and ``sample_biased``'s
    nucleus, min-p and race are these (as its ``_TOP_P_PARTIAL`` shortcut over 1024 ids).
    The one arithmetic difference from ``sample_biased``'s reference is the f32 order of
    the normalizer's sum (here chunk by chunk; the bisection kernel's differs too).

    Args: as ``sample_merge``, plus ``chunk_mass`` ``[R, P]`` f32 (after ``chunk_arg``),
        ``C`` ids per chunk and ``KN`` candidates a nucleus row keeps (after ``KM``).
        ``selected`` is ``[R, 2 * max(KM, KN)]`` i32 scratch (the GPU kernel's staging;
        the reference writes nothing to it).
    """
    for r in range(R):
        s = int(slot[r])
        if s < 0:
            sampled[r] = -1
            continue
        temp, k, tp = float(temperature[r]), int(top_k[r]), float(top_p[r])
        best = chunk_max[r, :P].max()
        if temp > 0.0 and np.isfinite(best) and uses_nucleus(temp, tp, k, V):
            tok = _nucleus_draw(chunk_max, chunk_mass, cand_key, cand_id, r, V, P, C, KM, KN,
                                temp, tp, float(min_p[r]), int(seed[r, 0]), int(seed[r, 1]),
                                int(positions[r]))
            sampled[r] = tok
            if tok != UNRESOLVED and sampling_decision[r] != 0:
                histogram[s, tok] += 1
            continue
        one = np.array([r])
        out = np.zeros(1, np.int32)
        sample_merge(chunk_max[one], chunk_arg[one], cand_key[one], cand_id[one], slot[one],
                     positions[one], sampling_decision[one], seed[one], temperature[one],
                     top_p[one], top_k[one], min_p[one], histogram,
                     np.zeros((1, 2 * KM), np.int32), out, 1, V, P, KM)
        sampled[r] = out[0]
