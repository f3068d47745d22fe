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

from .rng import philox_uniform
from .sampling import (
    _race,
    _top_k,
    _top_p_prefix,
    _truncate,
    row_logits,
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
        z = row_logits(logits, slot, presence, frequency, repetition, histogram, logit_bias,
                       use_bias, grammar_mask, use_mask, r, V, W32)
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
        z = row_logits(logits, slot, presence, frequency, repetition, histogram, logit_bias,
                       use_bias, grammar_mask, use_mask, r, V, W32)
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
            chunk_mass[r, c] = chunk_softmax_mass(zt)


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
    zmax, S = row_normalizer(chunk_max[r, :P], chunk_mass[r, :P], temp)
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


# The wide form (docs/gpu.md, "Sampling at greedy speed", design point 4): every sampled
# row with no top-k (top-p, temperature alone, min-p; with penalties, bias, mask) is drawn
# by programs over the row's chunks, never by one program sweeping the row. After the
# nucleus merge, ``sample_race`` (grid R x P) computes each id's exact probability and
# race score and sorts the ids into RACE_SLOTS probability slots per chunk: slot 0 above
# the level's range, slots 1.. of 2**shift f32 bit patterns each below its top, the last
# slot also everything lower. Per (chunk, slot) it writes the mass and the best race
# score with its id. ``sample_pick`` (grid R) sums the slots over the chunks: the slot in
# which the cumulative mass first reaches top_p holds the nucleus's end; every id in a
# slot before it is in the nucleus, every id after it out. The row's token is the best
# score of the slots before it whenever that beats the best score inside it: the race's
# winner over any set between those two is then that id. Otherwise a second level
# repeats it with the uncertain slot split into RACE_SLOTS - 1 finer ones, and a row still
# uncertain after it is left UNRESOLVED to ``sample_rest``. Exact: the token is always
# ``sample_biased``'s, up to the f32 summation order of the masses (as every form).
RACE_SLOTS = 128
RACE_SHIFT = 20   # level 1: 2**20 f32 bit patterns (1/8 of a binade) per slot
RACE_SPLIT = 7    # level 2: each by 2**7 (RACE_SHIFT - RACE_SPLIT = 13 bits per slot)


def uses_wide(temperature: float, top_k: int, V: int) -> bool:
    """Whether a sampled row has no top-k (``top_k <= 0`` or ``>= V``): the rows the wide
    form draws over the row's chunks (top-p or not)."""
    return temperature > 0.0 and not 0 < top_k < V


def sample_chunks_wide(
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
    """``sample_chunks_nucleus`` that writes each chunk's softmax mass for every row with
    no top-k (``uses_wide``), with top_p < 1 or not (the race needs the row's
    normalizer); candidates as ``sample_chunks_nucleus``.

    Reference loop: ``sample_chunks_nucleus``'s, then for each live row with
    ``uses_wide(temperature[r], top_k[r], V)`` and each chunk::

        chunk_mass[r, c] = sum(exp(zt - max(zt))) in f32  (0 when max(zt) = -inf)

    Args: as ``sample_chunks_nucleus``.
    """
    sample_chunks_nucleus(logits, slot, temperature, top_p, top_k, presence, frequency,
                          repetition, histogram, logit_bias, use_bias, grammar_mask, use_mask,
                          chunk_max, chunk_arg, chunk_mass, cand_key, cand_id, R, V, W32, C,
                          KM)
    P = -(-V // C)
    for r in range(R):
        if int(slot[r]) < 0 or not uses_wide(float(temperature[r]), int(top_k[r]), V):
            continue
        zt_row = row_logits(logits, slot, presence, frequency, repetition, histogram,
                             logit_bias, use_bias, grammar_mask, use_mask, r, V, W32)
        zt_row = zt_row / np.float32(temperature[r])
        for c in range(P):
            zt = zt_row[c * C:min((c + 1) * C, V)]
            chunk_mass[r, c] = chunk_softmax_mass(zt)


def chunk_softmax_mass(zt: NDArray[np.float32]) -> np.float32:
    """One chunk's ``sum(exp(zt - max(zt)))`` in f32 (0 when every id is -inf): the mass
    every chunked form writes, relative to the chunk's own maximum."""
    top = zt.max()
    if not top > -np.inf:
        return np.float32(0.0)
    with np.errstate(under="ignore", invalid="ignore"):
        e = np.where(zt > -np.inf, np.exp(zt - top), np.float32(0))
    return e.sum(dtype=np.float32)


def row_normalizer(chunk_max: NDArray[np.float32], chunk_mass: NDArray[np.float32],
                   temperature: float) -> tuple[np.float32, np.float32]:
    """One row's ``(zmax, S)`` from its chunks: the largest scaled logit and the softmax
    normalizer ``sum_c exp(chunk_max[c] / T - zmax) * chunk_mass[c]`` (f32), as
    ``sample_merge_nucleus``."""
    t = np.float32(temperature)
    zmax = chunk_max.max() / t
    with np.errstate(under="ignore", invalid="ignore"):
        scale = np.where(chunk_max > -np.inf, np.exp(chunk_max / t - zmax), np.float32(0))
    return np.float32(zmax), (scale * chunk_mass).sum(dtype=np.float32)


def race_slots(p: NDArray[np.float32], hi: int, shift: int, NB: int) -> NDArray[np.int64]:
    """Probability slots of f32 probabilities ``p``: 0 above bit pattern ``hi``, else
    ``(hi - bits(p)) >> shift`` + 1, at most ``NB - 1``. Equal probabilities share a slot
    and slots never increase with p."""
    b = np.ascontiguousarray(p, np.float32).view(np.int32).astype(np.int64)
    return np.where(b > hi, 0, np.minimum(((hi - b) >> shift) + 1, NB - 1))


def _wide_row(sampled, slot, temperature, top_k, V, r) -> bool:
    return (int(slot[r]) >= 0 and int(sampled[r]) == UNRESOLVED
            and uses_wide(float(temperature[r]), int(top_k[r]), V))


def sample_race(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
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
    chunk_max: NDArray[np.float32],
    chunk_mass: NDArray[np.float32],
    sampled: NDArray[np.int32],
    race_level: NDArray[np.int32],
    race_mass: NDArray[np.float32],
    race_best: NDArray[np.int32],
    race_arg: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
    C: int,
    NB: int,
    LEVEL: int,
) -> None:
    """Per (row, chunk, probability slot) of the rows the merge left UNRESOLVED with no
    top-k: the slot's mass and its best race score and id.

    Reference loop::

        for r with slot[r] >= 0, sampled[r] == UNRESOLVED, uses_wide(T, top_k[r], V):
            zmax, S = row_normalizer(chunk_max[r], chunk_mass[r], T)
            if LEVEL == 1: race_level[r] = (bits(f32(1 / S)), RACE_SHIFT)
            elif race_level[r, 1] < 0: continue              # level 1 gave up on it
            hi, shift = race_level[r]
            zt = z / T                                       # z as sample_biased's
            p = f32(exp(zt - zmax) / S)                       # the reference's p, f32
            pmin = min_p * f32(1 / S) if min_p > 0 else -1
            score = log(p) - log(-log(philox_u(seed, position, id)))   # f64; -inf if p < pmin
            j = race_slots(p, hi, shift, NB)
            for each chunk c and slot j:                     # over the chunk's ids
                race_mass[r, c*NB + j] = sum(p)               # f32, 0 if empty
                race_best[r, c*NB + j] = max(score)           # f64 as (lo, hi) i32 words
                race_arg[r, c*NB + j] = min id with score == max (INT_MAX if empty)

    Args:
        logits ... use_mask: as ``sample_biased`` (positions, seed, temperature, top_k,
            min_p: ``[R]``).
        chunk_max, chunk_mass: ``[R, P]`` f32 from ``sample_chunks_wide``.
        sampled: ``[R]`` i32 from the merge (read).
        race_level: ``[R, 2]`` i32 (slot top bit pattern, shift): written at level 1,
            read at level 2 (shift < 0: the row is not raced).
        race_mass: ``[R, P * NB]`` f32, written for raced rows.
        race_best: ``[R, P * NB * 2]`` i32: f64 scores as little-endian word pairs.
        race_arg: ``[R, P * NB]`` i32.
        R, V, W32: as ``sample_biased``. C: ids per chunk. NB: slots (RACE_SLOTS).
        LEVEL: 1 or 2.
    """
    P = -(-V // C)
    best64 = race_best.view(np.float64)
    for r in range(R):
        if not _wide_row(sampled, slot, temperature, top_k, V, r):
            continue
        temp = float(temperature[r])
        zmax, S = row_normalizer(chunk_max[r, :P], chunk_mass[r, :P], temp)
        if LEVEL == 1:
            race_level[r] = (int(np.float32(np.float32(1.0) / S).view(np.int32)), RACE_SHIFT)
        elif race_level[r, 1] < 0:
            continue
        hi, shift = int(race_level[r, 0]), int(race_level[r, 1])
        zt = row_logits(logits, slot, presence, frequency, repetition, histogram, logit_bias,
                         use_bias, grammar_mask, use_mask, r, V, W32) / np.float32(temp)
        with np.errstate(under="ignore", over="ignore", invalid="ignore"):
            p = np.exp(zt - zmax) / S
        p = np.where(zt > -np.inf, p, np.float32(0)).astype(np.float32)
        mp = float(min_p[r])
        pmin = np.float32(mp) * (np.float32(1.0) / S) if mp > 0.0 else np.float32(-1.0)
        ids = np.arange(V)
        u = philox_uniform(int(seed[r, 0]), int(seed[r, 1]), int(positions[r]), ids)
        with np.errstate(divide="ignore"):
            score = np.log(p.astype(np.float64)) - np.log(-np.log(u))
        score = np.where(p >= pmin, score, -np.inf)
        j = race_slots(p, hi, shift, NB)
        for c in range(P):
            lo, up = c * C, min((c + 1) * C, V)
            jc, pc, sc = j[lo:up], p[lo:up], score[lo:up]
            mass = np.zeros(NB, np.float32)
            np.add.at(mass, jc, pc)  # f32, in id order (the device's order differs)
            best = np.full(NB, -np.inf)
            np.maximum.at(best, jc, sc)
            arg = np.full(NB, INT32_MAX, np.int64)
            win = sc == best[jc]
            np.minimum.at(arg, jc[win], ids[lo:up][win])
            race_mass[r, c * NB:(c + 1) * NB] = mass
            best64[r, c * NB:(c + 1) * NB] = best
            race_arg[r, c * NB:(c + 1) * NB] = arg


INT32_MAX = 2**31 - 1


def sample_pick(
    race_mass: NDArray[np.float32],
    race_best: NDArray[np.int32],
    race_arg: NDArray[np.int32],
    slot: NDArray[np.int32],
    sampling_decision: NDArray[np.int32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    histogram: NDArray[np.int32],
    race_level: NDArray[np.int32],
    sampled: NDArray[np.int32],
    R: int,
    V: int,
    P: int,
    NB: int,
    LEVEL: int,
) -> None:
    """Each raced row's token from its slots, when the slots prove it; else at level 1 the
    uncertain slot for level 2, at level 2 nothing (the row stays UNRESOLVED).

    Reference loop (rows as ``sample_race``'s)::

        M[j] = sum over chunks of race_mass[r, c*NB + j]          # f32
        best[j], arg[j] = the largest race_best over chunks (lowest arg on ties)
        e = first j with cumsum(M)[j] >= top_p[r] if top_p[r] < 1, else none
        if e is none: tok = arg of the largest best (all slots)
        else:
            tin, ain = the largest best over slots j < e (lowest arg on ties)
            if best[e] < tin or (best[e] == tin and ain < arg[e]): tok = ain
            elif LEVEL == 1 and 1 <= e <= NB - 2:
                race_level[r] = (hi - (e - 1) << shift, shift - RACE_SPLIT); continue
            else:
                if LEVEL == 1: race_level[r, 1] = -1
                continue                                       # sample_rest draws it
        sampled[r] = tok; if sampling_decision[r]: histogram[slot[r], tok] += 1

    Every id in slots before ``e`` is in the nucleus (the mass ahead of it is below
    top_p) and every id after it out (the mass ahead reaches top_p), so the race's
    winner over the nucleus is ``ain`` whenever it beats every id of slot ``e``.

    Args: ``sample_race``'s outputs, plus slot, sampling_decision, temperature, top_p,
        top_k (``[R]``) and histogram (``[S, V]``, updated) as ``sample_biased``;
        race_level ``[R, 2]`` i32 (inout); sampled ``[R]`` i32 (inout). P: chunks per
        row. NB: slots. LEVEL: 1 or 2.
    """
    best64 = race_best.view(np.float64)
    for r in range(R):
        if not _wide_row(sampled, slot, temperature, top_k, V, r):
            continue
        if LEVEL == 2 and race_level[r, 1] < 0:
            continue
        mass = race_mass[r, :P * NB].reshape(P, NB).sum(axis=0, dtype=np.float32)
        bests = best64[r, :P * NB].reshape(P, NB)
        args = race_arg[r, :P * NB].reshape(P, NB).astype(np.int64)
        best = bests.max(axis=0)
        arg = np.where(bests == best[None, :], args, INT32_MAX).min(axis=0)
        tp = np.float32(top_p[r])
        reach = np.flatnonzero(np.cumsum(mass, dtype=np.float32) >= tp) if tp < 1.0 else []
        e = int(reach[0]) if len(reach) else NB
        tin = best[:e].max() if e > 0 else -np.inf
        ain = int(np.where(best[:e] == tin, arg[:e], INT32_MAX).min()) if e > 0 else INT32_MAX
        if e < NB and not (best[e] < tin or (best[e] == tin and ain < arg[e])):
            if LEVEL == 1 and 1 <= e <= NB - 2:
                hi, shift = int(race_level[r, 0]), int(race_level[r, 1])
                race_level[r] = (hi - ((e - 1) << shift), shift - RACE_SPLIT)
            elif LEVEL == 1:
                race_level[r, 1] = -1
            continue
        sampled[r] = ain
        if sampling_decision[r] != 0:
            histogram[int(slot[r]), ain] += 1


# The candidate race (docs/gpu.md, "Sampling at greedy speed", design point 5): the
# sampler of cores exported since. Every sampled row with no top-k (``uses_wide``: top-p,
# temperature alone, min-p; with penalties, bias and mask) is drawn by the exponential
# race itself, not by locating its nucleus first. The race's winner over the kept ids is
# the first id, in race-score order, that is kept; an id with probability p is in the
# nucleus exactly when the mass of the ids ahead of it (p descending, ties: lower id) is
# below top_p. So: ``sample_race_top`` (grid R x P) keeps each chunk's RACE_TOP best race
# scores; ``sample_race_mass`` (grid R x P) takes the row's RACE_TOP best of those (the
# row's exact top by score, ties: lower id) and sums, per chunk, the mass ahead of each;
# ``sample_race_pick`` (grid R) draws the first of them whose mass ahead is below top_p
# (or is zero: the most probable id) and leaves none to chance: a row whose every
# candidate lies outside its nucleus (probability about (1 - top_p)**RACE_TOP on flat
# rows) and every other unresolved row run ``sample_biased``'s row there. Exact: the
# token is always ``sample_biased``'s, up to the f32 summation order of the masses.
RACE_TOP = 4
INT32_MAX_ID = 2**31 - 1


def sample_chunks_mass(
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
    chunk_mass: NDArray[np.float32],
    cand_key: NDArray[np.int32],
    cand_id: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
    C: int,
    KM: int,
) -> None:
    """``sample_chunks`` that also writes each chunk's softmax mass relative to its own
    maximum for every sampled row with no top-k (``uses_wide``; no nucleus candidates).

    Reference loop: ``sample_chunks``' for every live row, then for each live row with
    ``uses_wide(temperature[r], top_k[r], V)`` and each chunk::

        zt = z[ids] / temperature[r]                      # z: biased, penalized, masked
        chunk_mass[r, c] = sum(exp(zt - max(zt))) in f32  (0 when max(zt) = -inf)

    Args: as ``sample_chunks``, plus ``chunk_mass`` ``[R, P]`` f32 (after ``chunk_arg``),
        written for those rows.
    """
    sample_chunks(logits, slot, temperature, top_k, presence, frequency, repetition,
                  histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                  chunk_arg, cand_key, cand_id, R, V, W32, C, KM)
    P = -(-V // C)
    for r in range(R):
        if int(slot[r]) < 0 or not uses_wide(float(temperature[r]), int(top_k[r]), V):
            continue
        zt_row = row_logits(logits, slot, presence, frequency, repetition, histogram,
                            logit_bias, use_bias, grammar_mask, use_mask, r, V, W32)
        zt_row = zt_row / np.float32(temperature[r])
        for c in range(P):
            zt = zt_row[c * C:min((c + 1) * C, V)]
            chunk_mass[r, c] = chunk_softmax_mass(zt)


def race_probabilities(logits, slot, temperature, min_p, presence, frequency, repetition,
                       histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                       chunk_mass, r, V, W32, P
                       ) -> tuple[NDArray[np.float32], NDArray[np.float32], np.float32]:
    """Row r's scaled logits ``zt``, their f32 probabilities ``exp(zt - zmax) / S``
    (``race_p``: ``row_normalizer``'s zmax and S) and its min-p floor ``min_p * (1 / S)``
    (-1 without min-p): the values the race forms give each id, as ``sample_biased``'s
    up to the order of S's sum."""
    temp = float(temperature[r])
    zmax, S = row_normalizer(chunk_max[r, :P], chunk_mass[r, :P], temp)
    zt = row_logits(logits, slot, presence, frequency, repetition, histogram, logit_bias,
                    use_bias, grammar_mask, use_mask, r, V, W32) / np.float32(temp)
    mp = float(min_p[r])
    pmin = np.float32(mp) * (np.float32(1.0) / S) if mp > 0.0 else np.float32(-1.0)
    return zt, race_p(zt, zmax, S), np.float32(pmin)


def race_p(zt: NDArray[np.float32], zmax: np.float32, S: np.float32) -> NDArray[np.float32]:
    """f32 probabilities ``exp(zt - zmax) / S`` of scaled logits ``zt`` (0 where -inf)."""
    with np.errstate(under="ignore", over="ignore", invalid="ignore"):
        p = np.exp(zt - zmax) / S
    return np.where(zt > -np.inf, p, np.float32(0)).astype(np.float32)


def race_scores(p: NDArray[np.float32], pmin: np.float32, seed_lo: int, seed_hi: int,
                position: int) -> NDArray[np.float64]:
    """The race score of every id of a row, ``log p - log(-log u)`` in f64 (``_race``'s),
    -inf where ``p < pmin``."""
    u = philox_uniform(seed_lo, seed_hi, position, np.arange(p.size))
    with np.errstate(divide="ignore"):
        score = np.log(p.astype(np.float64)) - np.log(-np.log(u))
    return np.where(p >= pmin, score, -np.inf)


def _raced(sampled, slot, temperature, top_k, V, r) -> bool:
    return _wide_row(sampled, slot, temperature, top_k, V, r)


def sample_race_top(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
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
    chunk_max: NDArray[np.float32],
    chunk_mass: NDArray[np.float32],
    sampled: NDArray[np.int32],
    top_score: NDArray[np.int32],
    top_id: NDArray[np.int32],
    top_zt: NDArray[np.float32],
    R: int,
    V: int,
    W32: int,
    C: int,
    M: int,
) -> None:
    """Per (row, chunk) of the rows the merge left UNRESOLVED with no top-k: the chunk's
    M best race scores, best first (ties: lower id), their ids and probabilities.

    Reference loop::

        for r with slot[r] >= 0, sampled[r] == UNRESOLVED, uses_wide(T, top_k[r], V):
            zt, p, pmin = race_probabilities(...)          # f32, as sample_race's
            score = race_scores(p, pmin, seed[r], positions[r])   # f64, -inf below min-p
            for each chunk c: the M largest (score, -id) of its ids, best first
                top_score[r, c*M + m] = that score (f64 as two i32 words; -inf past the
                                        chunk's finite scores)
                top_id[r, c*M + m] = its id (INT32_MAX where the score is -inf)
                top_zt[r, c*M + m] = its scaled logit zt (-inf where the score is -inf)

    Args:
        logits ... use_mask: as ``sample_biased`` (``[R]`` row parameters).
        chunk_max, chunk_mass: ``[R, P]`` f32 from ``sample_chunks_mass``.
        sampled: ``[R]`` i32 from the merge (read).
        top_score: ``[R, P * M * 2]`` i32: f64 scores as little-endian word pairs, written
            for raced rows; top_id ``[R, P * M]`` i32; top_zt ``[R, P * M]`` f32 (the
            scaled logit, so a later kernel recomputes p with its own S: one order of
            every p it compares).
        R, V, W32: as ``sample_biased``. C: ids per chunk. M: candidates per chunk.
    """
    P = -(-V // C)
    score64 = top_score.view(np.float64)
    for r in range(R):
        if not _raced(sampled, slot, temperature, top_k, V, r):
            continue
        zt, p, pmin = race_probabilities(logits, slot, temperature, min_p, presence,
                                         frequency, repetition, histogram, logit_bias,
                                         use_bias, grammar_mask, use_mask, chunk_max,
                                         chunk_mass, r, V, W32, P)
        score = race_scores(p, pmin, int(seed[r, 0]), int(seed[r, 1]), int(positions[r]))
        for c in range(P):
            lo, up = c * C, min((c + 1) * C, V)
            ids = np.arange(lo, up)
            order = np.lexsort((ids, -score[lo:up]))[:M]
            best = np.full(M, -np.inf)
            arg = np.full(M, INT32_MAX_ID, np.int64)
            cz = np.full(M, -np.inf, np.float32)
            n = order.size
            best[:n], arg[:n], cz[:n] = score[lo:up][order], ids[order], zt[lo:up][order]
            pad = best == -np.inf
            arg[pad], cz[pad] = INT32_MAX_ID, -np.inf
            score64[r, c * M:(c + 1) * M] = best
            top_id[r, c * M:(c + 1) * M] = arg
            top_zt[r, c * M:(c + 1) * M] = cz


def race_candidates(top_score: NDArray[np.int32], top_id: NDArray[np.int32],
                    top_zt: NDArray[np.float32], P: int, M: int
                    ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float32]]:
    """One row's M best race scores over its chunks' (score desc, ties: lower id): the
    row's exact top-M by race score; (scores f64, ids, scaled logits f32), best first."""
    score = top_score[:2 * P * M].view(np.float64)
    ids = top_id[:P * M].astype(np.int64)
    order = np.lexsort((ids, -score))[:M]
    return score[order], ids[order], top_zt[:P * M][order]


def sample_race_mass(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
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
    chunk_max: NDArray[np.float32],
    chunk_mass: NDArray[np.float32],
    sampled: NDArray[np.int32],
    top_score: NDArray[np.int32],
    top_id: NDArray[np.int32],
    top_zt: NDArray[np.float32],
    ahead: NDArray[np.float32],
    R: int,
    V: int,
    W32: int,
    C: int,
    M: int,
) -> None:
    """Per (row, chunk) of the raced rows with top_p < 1: the chunk's probability mass
    ahead of each of the row's M race candidates in the nucleus order.

    Reference loop::

        for r raced (as sample_race_top) with top_p[r] < 1:
            zt, p, _ = race_probabilities(...)
            _, cid, cz = race_candidates(top_score[r], top_id[r], top_zt[r], P, M)
            cp = race_p(cz, zmax, S)                      # the same f32 formula as p
            for each chunk c and candidate m:               # ids j of the chunk
                ahead[r, c*M + m] = sum of p[j] over j with p[j] > cp[m] or
                                    (p[j] == cp[m] and j < cid[m])         # f32

    Args: as ``sample_race_top`` (its outputs read), plus top_p ``[R]`` f32 and ahead
        ``[R, P * M]`` f32, written for those rows.
    """
    P = -(-V // C)
    for r in range(R):
        if not _raced(sampled, slot, temperature, top_k, V, r) or not top_p[r] < 1.0:
            continue
        _, p, _ = race_probabilities(logits, slot, temperature, min_p, presence, frequency,
                                     repetition, histogram, logit_bias, use_bias,
                                     grammar_mask, use_mask, chunk_max, chunk_mass, r, V,
                                     W32, P)
        _, cid, cz = race_candidates(top_score[r], top_id[r], top_zt[r], P, M)
        zmax, S = row_normalizer(chunk_max[r, :P], chunk_mass[r, :P], float(temperature[r]))
        cp = race_p(cz, zmax, S)
        for c in range(P):
            lo, up = c * C, min((c + 1) * C, V)
            pc, ids = p[lo:up], np.arange(lo, up)
            for m in range(M):
                before = (pc > cp[m]) | ((pc == cp[m]) & (ids < cid[m]))
                ahead[r, c * M + m] = pc[before].sum(dtype=np.float32)


def sample_race_pick(
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
    top_score: NDArray[np.int32],
    top_id: NDArray[np.int32],
    top_zt: NDArray[np.float32],
    ahead: NDArray[np.float32],
    sampled: NDArray[np.int32],
    R: int,
    V: int,
    W32: int,
    P: int,
    M: int,
) -> None:
    """Every row still UNRESOLVED: a raced row's first race candidate inside its nucleus,
    else (and for every other unresolved row) ``sample_biased``'s row.

    Reference loop::

        for r with sampled[r] == UNRESOLVED:
            tok = None
            if raced (as sample_race_top):
                score, cid, _ = race_candidates(top_score[r], top_id[r], top_zt[r], P, M)
                before[m] = sum over chunks of ahead[r, c*M + m]          # f32
                tok = first cid[m] with score[m] > -inf and
                      (top_p[r] >= 1 or before[m] < top_p[r] or before[m] == 0)
            if tok is None: tok = sample_biased's row r        # as sample_rest
            sampled[r] = tok; if sampling_decision[r]: histogram[slot[r], tok] += 1

    The candidates are the row's best race scores over the ids min-p keeps, in order, so
    the first that top-p keeps is the race's winner over the kept ids.

    Args: as ``sample_rest`` (``sampled`` inout, ``histogram`` updated), plus
        ``sample_race_top``'s and ``sample_race_mass``' outputs. P: chunks per row. M:
        candidates per chunk.
    """
    score_ahead = ahead[:, :P * M]
    rest = np.zeros(R, np.int32)
    for r in range(R):
        if int(sampled[r]) != UNRESOLVED:
            continue
        if _raced(sampled, slot, temperature, top_k, V, r):
            score, cid, _ = race_candidates(top_score[r], top_id[r], top_zt[r], P, M)
            tp = np.float32(top_p[r])
            if tp < 1.0:
                part = score_ahead[r].reshape(P, M)
                before = np.array([part[:, m].sum(dtype=np.float32) for m in range(M)])
                inside = (before < tp) | (before == 0)
            else:
                inside = np.ones(M, bool)
            hit = np.flatnonzero((score > -np.inf) & inside)
            if hit.size:
                tok = int(cid[hit[0]])
                sampled[r] = tok
                if sampling_decision[r] != 0:
                    histogram[int(slot[r]), tok] += 1
                continue
        rest[r] = 1
    if rest.any():
        sub = np.where(rest != 0, UNRESOLVED, 0).astype(np.int32)
        sample_rest(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                    top_k, min_p, presence, frequency, repetition, histogram, logit_bias,
                    use_bias, grammar_mask, use_mask, sub, R, V, W32)
        sampled[rest != 0] = sub[rest != 0]
