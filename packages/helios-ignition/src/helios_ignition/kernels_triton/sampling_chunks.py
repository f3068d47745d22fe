"""Triton chunked sampler: ``sample_chunks`` (grid ``(R, P)``), ``sample_merge`` (grid
``(R,)``) and ``sample_rest`` (grid ``(R,)``), the three launches whose composition is
``sample_biased`` (NumPy references and the semantics: ``helios_tools.kernels
.sampling_chunks``; design: docs/gpu.md, "Sampling at greedy speed").

Each ``sample_chunks`` program reads its ``BLOCK_V`` ids once (``_logits``: bias,
penalties, mask, as ``sample_biased``) and keeps them in registers: the chunk's maximum
and first arg-max, and for top-k rows its local top-k found by a bisection over the
order-preserving keys that counts in registers (no memory traffic per probe), compacted
in id order with a prefix sum. ``sample_merge`` does the same exact top-k over the
``P x KMAX`` candidates, writes the ``k`` winners (ids, keys) to its row of
``selected`` and reads them back after a barrier as a ``KMAX``-wide vector; softmax,
top-p (each survivor's mass before it, from a ``KMAX x KMAX`` comparison: p descending,
ties to the lower id), min-p and the race (``_race_score``, float64) run on those. Rows it
cannot resolve go to ``sample_rest``, which is ``sample_biased``'s row body.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .sampling import INT_MAX, _key, _logits, _race_score, _sample_entry

INT_MIN = tl.constexpr(-2147483648)
UNRESOLVED = tl.constexpr(-2)


@triton.jit
def _kth_key(key, k):
    """Largest t with ``count(key >= t) >= k``: the k-th largest key (bisection over the
    int32 key space, 32 probes counted in registers)."""
    lo = tl.min(key, axis=0).to(tl.int64) * 0 + INT_MIN
    hi = lo * 0 + 2147483647
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        cnt = tl.sum((key.to(tl.int64) >= mid).to(tl.int32), axis=0)
        ok = cnt >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo.to(tl.int32)


@triton.jit
def _top_k_mask(key, valid, k):
    """The k largest keys among `valid` lanes, ties to the lowest lane (lanes are in
    ascending id order)."""
    key = tl.where(valid, key, INT_MIN)
    kth = _kth_key(key, k)
    gt = valid & (key > kth)
    eq = valid & (key == kth)
    ngt = tl.sum(gt.to(tl.int32), axis=0)
    rank = tl.cumsum(eq.to(tl.int32), axis=0)
    return gt | (eq & (rank <= k - ngt))


@triton.jit
def _chunk_z(logits, histogram, logit_bias, grammar_mask, use_bias, use_mask, repetition,
             frequency, presence, r, s, idx, V, W32):
    """Submission row r's (slot s) biased, penalized, masked f32 logits of ids ``idx``:
    ``_logits`` over the row's buffers, the one preparation of every chunk kernel."""
    return _logits(logits + r.to(tl.int64) * V, histogram + s.to(tl.int64) * V,
                   logit_bias + s.to(tl.int64) * V, grammar_mask + r.to(tl.int64) * W32, idx,
                   V, tl.load(use_bias + r), tl.load(use_mask + r), tl.load(repetition + r),
                   tl.load(frequency + r), tl.load(presence + r))


@triton.jit
def _store_candidates(zt, idx, V, k, cand_key, cand_id, base, KMAX: tl.constexpr):
    """A chunk's k largest scaled logits ``zt`` (ties: lower ids) as keys and ids in id
    order at ``base``, padded to KMAX with KEY_PAD / -1."""
    keep = _top_k_mask(_key(zt), idx < V, k)
    pos = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    n = tl.sum(keep.to(tl.int32), axis=0)
    tl.store(cand_key + base + pos, _key(zt), mask=keep)
    tl.store(cand_id + base + pos, idx, mask=keep)
    j = tl.arange(0, KMAX)
    tl.store(cand_key + base + j, tl.zeros_like(j) + INT_MIN, mask=j >= n)
    tl.store(cand_id + base + j, tl.zeros_like(j) - 1, mask=j >= n)


@triton.jit
def _chunk_mass(zt, cm, temp):
    """``sum(exp(zt - max(zt)))`` of a chunk whose unscaled maximum is ``cm`` (0 when every
    id is masked)."""
    top = tl.math.div_rn(cm, temp)  # = max(zt): division by temp > 0 is monotone
    e = tl.where(zt > float("-inf"), libdevice.exp(zt - top), 0.0)
    return tl.where(cm > float("-inf"), tl.sum(e, axis=0), 0.0)


@triton.jit
def sample_chunks(logits, slot, temperature, top_k, presence, frequency, repetition,
                  histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                  chunk_arg, cand_key, cand_id, R, V, W32, C, KM, BLOCK_V: tl.constexpr,
                  KMAX: tl.constexpr):
    """Per (row, chunk): maximum, first arg-max, and for top-k rows the local top-k
    candidates (keys and ids ascending, padded); grid ``(R, cdiv(V, BLOCK_V))``."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.cdiv(V, BLOCK_V)
    s = tl.load(slot + r)
    if s >= 0:
        idx = c * BLOCK_V + tl.arange(0, BLOCK_V)
        z = _chunk_z(logits, histogram, logit_bias, grammar_mask, use_bias, use_mask,
                     repetition, frequency, presence, r, s, idx, V, W32)
        cm = tl.max(z, axis=0)
        ci = tl.min(tl.where(z == cm, idx, INT_MAX), axis=0)
        at = r.to(tl.int64) * P + c
        tl.store(chunk_max + at, cm)
        tl.store(chunk_arg + at, ci)
        temp = tl.load(temperature + r)
        k = tl.load(top_k + r)
        if (temp > 0.0) & (k > 0) & (k <= KMAX) & (k < V):
            zt = tl.math.div_rn(z, temp + tl.zeros_like(z))
            _store_candidates(zt, idx, V, k, cand_key, cand_id, at * KMAX, KMAX)


@triton.jit
def _merge_top_k(cand_key, cand_id, srow, r, P, k, best, temp, tp, mp, pos, k0, k1,
                 BLOCK_C: tl.constexpr, KMAX: tl.constexpr):
    """The sampled id of a top-k row from its chunks' candidates (see sample_merge)."""
    cc = tl.arange(0, BLOCK_C)
    inside = cc < P * KMAX
    row = r.to(tl.int64) * P * KMAX
    ids = tl.load(cand_id + row + cc, mask=inside, other=-1)
    key = tl.load(cand_key + row + cc, mask=inside, other=INT_MIN)
    keep = _top_k_mask(key, inside & (ids >= 0), k)
    at = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    j = tl.arange(0, KMAX)
    tl.store(srow + at, ids, mask=keep)
    tl.store(srow + KMAX + at, key, mask=keep)
    tl.store(srow + j, tl.zeros_like(j) - 1, mask=j >= k)
    tl.store(srow + KMAX + j, tl.zeros_like(j) + INT_MIN, mask=j >= k)
    tl.debug_barrier()  # the winners, written by many threads, read back as one vector
    sid = tl.load(srow + j)
    sk = tl.load(srow + KMAX + j)
    live = j < k
    zt = tl.where(sk >= 0, sk, sk ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    zmax = tl.math.div_rn(best, temp)
    e = tl.where(live, libdevice.exp(zt - zmax), 0.0)
    S = tl.sum(e, axis=0)
    p = tl.math.div_rn(e, S + tl.zeros_like(e))
    kept = live
    if tp < 1.0:
        # Mass before each survivor in p-descending order (ties: lower id first): the
        # shortest prefix reaching tp keeps exactly the ids whose mass before is < tp.
        pi = p[:, None]
        pj = p[None, :]
        ahead = live[None, :] & ((pj > pi) | ((pj == pi) & (sid[None, :] < sid[:, None])))
        before = tl.sum(tl.where(ahead, pj, 0.0), axis=1)
        first = tl.sum(ahead.to(tl.int32), axis=1) == 0
        kept = live & ((before < tp) | first)
    pmin = tl.where(mp > 0.0, mp * tl.math.div_rn(1.0, S), -1.0)
    kept = kept & (p >= pmin)
    race = tl.where(kept, _race_score(p, sid, pos, k0, k1), float("-inf"))
    cm = tl.max(race, axis=0)
    return tl.min(tl.where(kept & (race == cm), sid, INT_MAX), axis=0)


@triton.jit
def sample_merge(chunk_max, chunk_arg, cand_key, cand_id, slot, positions, sampling_decision,
                 seed, temperature, top_p, top_k, min_p, histogram, selected, sampled, R, V,
                 P, KM, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, KMAX: tl.constexpr):
    """Greedy and top-k rows from their chunks; other sampling rows marked UNRESOLVED;
    grid ``(R,)``."""
    r = tl.program_id(0)
    s = tl.load(slot + r)
    if s < 0:
        tl.store(sampled + r, -1)
    else:
        pp = tl.arange(0, BLOCK_P)
        vals = tl.load(chunk_max + r.to(tl.int64) * P + pp, mask=pp < P, other=float("-inf"))
        args = tl.load(chunk_arg + r.to(tl.int64) * P + pp, mask=pp < P, other=INT_MAX)
        best = tl.max(vals, axis=0)
        tok = tl.min(tl.where((pp < P) & (vals == best), args, INT_MAX), axis=0)
        state = tok * 0  # 0: resolved here, 1: left to sample_rest
        temp = tl.load(temperature + r)
        k = tl.load(top_k + r)
        if (temp > 0.0) & (best > float("-inf")):
            if (k > 0) & (k <= KMAX) & (k < V):
                tok = _merge_top_k(cand_key, cand_id, selected + r.to(tl.int64) * 2 * KMAX, r,
                                   P, k, best, temp, tl.load(top_p + r), tl.load(min_p + r),
                                   tl.load(positions + r), tl.load(seed + 2 * r),
                                   tl.load(seed + 2 * r + 1), BLOCK_C, KMAX)
            else:
                state = state + 1
        if state == 0:
            tl.store(sampled + r, tok)
            if tl.load(sampling_decision + r) != 0:
                tl.atomic_add(histogram + s.to(tl.int64) * V + tok, 1)
        else:
            tl.store(sampled + r, UNRESOLVED)


@triton.jit
def sample_rest(logits, slot, positions, sampling_decision, seed, temperature, top_p, top_k,
                min_p, presence, frequency, repetition, histogram, logit_bias, use_bias,
                grammar_mask, use_mask, sampled, R, V, W32, BLOCK_V: tl.constexpr):
    """``sample_biased`` for rows marked UNRESOLVED (the bisection sweeps); every other row
    returns at once; grid ``(R,)``."""
    r = tl.program_id(0)
    if tl.load(sampled + r) == UNRESOLVED:
        _sample_entry(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                      top_k, min_p, presence, frequency, repetition, histogram, logit_bias,
                      use_bias, grammar_mask, use_mask, sampled, V, W32, True, BLOCK_V)


@triton.jit
def _chunks_nucleus(logits, slot, temperature, top_p, top_k, presence, frequency, repetition,
                    histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                    chunk_arg, chunk_mass, cand_key, cand_id, V, W32, BLOCK_V: tl.constexpr,
                    KMAX: tl.constexpr, WIDE: tl.constexpr):
    """The body of ``sample_chunks_nucleus`` and (``WIDE``: the mass of every row with no
    top-k, top-p or not) ``sample_chunks_wide``."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.cdiv(V, BLOCK_V)
    s = tl.load(slot + r)
    if s >= 0:
        idx = c * BLOCK_V + tl.arange(0, BLOCK_V)
        z = _chunk_z(logits, histogram, logit_bias, grammar_mask, use_bias, use_mask,
                     repetition, frequency, presence, r, s, idx, V, W32)
        cm = tl.max(z, axis=0)
        ci = tl.min(tl.where(z == cm, idx, INT_MAX), axis=0)
        at = r.to(tl.int64) * P + c
        tl.store(chunk_max + at, cm)
        tl.store(chunk_arg + at, ci)
        temp = tl.load(temperature + r)
        k = tl.load(top_k + r)
        no_k = (k <= 0) | (k >= V)
        nucleus = (tl.load(top_p + r) < 1.0) & no_k
        if WIDE:
            massed = no_k
        else:
            massed = nucleus
        if (temp > 0.0) & (((k > 0) & (k <= KMAX) & (k < V)) | nucleus | massed):
            zt = tl.math.div_rn(z, temp + tl.zeros_like(z))
            if ((k > 0) & (k <= KMAX) & (k < V)) | nucleus:
                _store_candidates(zt, idx, V, tl.where(nucleus, KMAX, k), cand_key, cand_id,
                                  at * KMAX, KMAX)
            if massed:
                tl.store(chunk_mass + at, _chunk_mass(zt, cm, temp))


@triton.jit
def sample_chunks_nucleus(logits, slot, temperature, top_p, top_k, presence, frequency,
                          repetition, histogram, logit_bias, use_bias, grammar_mask, use_mask,
                          chunk_max, chunk_arg, chunk_mass, cand_key, cand_id, R, V, W32, C,
                          KM, BLOCK_V: tl.constexpr, KMAX: tl.constexpr):
    """``sample_chunks``, and for top-p rows with no top-k also the chunk's top-KMAX
    candidates and its softmax mass relative to its own maximum; grid
    ``(R, cdiv(V, BLOCK_V))``."""
    _chunks_nucleus(logits, slot, temperature, top_p, top_k, presence, frequency, repetition,
                    histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                    chunk_arg, chunk_mass, cand_key, cand_id, V, W32, BLOCK_V, KMAX, False)


@triton.jit
def sample_chunks_wide(logits, slot, temperature, top_p, top_k, presence, frequency,
                       repetition, histogram, logit_bias, use_bias, grammar_mask, use_mask,
                       chunk_max, chunk_arg, chunk_mass, cand_key, cand_id, R, V, W32, C, KM,
                       BLOCK_V: tl.constexpr, KMAX: tl.constexpr):
    """``sample_chunks_nucleus`` that writes the chunk's mass for every sampled row with
    no top-k (the race's normalizer); grid ``(R, cdiv(V, BLOCK_V))``."""
    _chunks_nucleus(logits, slot, temperature, top_p, top_k, presence, frequency, repetition,
                    histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                    chunk_arg, chunk_mass, cand_key, cand_id, V, W32, BLOCK_V, KMAX, True)


@triton.jit
def _merge_nucleus(cand_key, cand_id, chunk_max, chunk_mass, srow, r, P, V, C, temp, tp, mp,
                   pos, k0, k1, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                   KMAX: tl.constexpr, NMAX: tl.constexpr, JB: tl.constexpr):
    """The sampled id of a top-p row with no top-k from its chunks' candidates, or
    UNRESOLVED when its nucleus is not provably inside them (see sample_merge_nucleus)."""
    # The full row's normalizer from each chunk's mass, scaled to the row's maximum.
    zmax, S = _row_normalizer(chunk_max, chunk_mass, r, P, temp, BLOCK_P)
    pp = tl.arange(0, BLOCK_P)
    # The NMAX largest candidates, and the largest key of every id left out of them.
    cc = tl.arange(0, BLOCK_C)
    inside = cc < P * KMAX
    row = r.to(tl.int64) * P * KMAX
    ids = tl.load(cand_id + row + cc, mask=inside, other=-1)
    key = tl.load(cand_key + row + cc, mask=inside, other=INT_MIN)
    valid = inside & (ids >= 0)
    pick = _top_k_mask(key, valid, NMAX)
    left = tl.max(tl.where(valid & ~pick, key, INT_MIN), axis=0)
    j2 = tl.arange(0, KMAX)
    key2 = tl.load(cand_key + row + pp[:, None] * KMAX + j2[None, :],
                   mask=(pp < P)[:, None] & (j2 < KMAX)[None, :], other=INT_MAX)
    kth = tl.min(key2, axis=1)  # a truncated chunk's KM-th key bounds the ids it left out
    truncated = (pp < P) & (tl.minimum(V - pp * C, C) > KMAX)
    bound = tl.maximum(left, tl.max(tl.where(truncated, kth, INT_MIN), axis=0))
    at = tl.cumsum(pick.to(tl.int32), axis=0) - 1
    npick = tl.sum(pick.to(tl.int32), axis=0)
    j = tl.arange(0, NMAX)
    tl.store(srow + at, ids, mask=pick)
    tl.store(srow + NMAX + at, key, mask=pick)
    tl.store(srow + j, tl.zeros_like(j) - 1, mask=j >= npick)
    tl.store(srow + NMAX + j, tl.zeros_like(j) + INT_MIN, mask=j >= npick)
    tl.debug_barrier()  # the picks, written by many threads, read back as one vector
    sid = tl.load(srow + j)
    sk = tl.load(srow + NMAX + j)
    live = j < npick
    zt = tl.where(sk >= 0, sk, sk ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    p = tl.where(live, tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt)), 0.0)
    # Mass before each pick in p-descending order (ties: lower id first): the shortest
    # prefix reaching tp keeps exactly the ids whose mass before is < tp. Compared in
    # blocks of JB picks re-read from the staging row (NMAX x JB values in registers).
    before = tl.zeros_like(p)
    nahead = tl.zeros_like(j)
    for j0 in tl.static_range(0, NMAX, JB):
        jb = j0 + tl.arange(0, JB)
        bid = tl.load(srow + jb)
        bk = tl.load(srow + NMAX + jb)
        bz = tl.where(bk >= 0, bk, bk ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
        pb = tl.where(jb < npick,
                      tl.math.div_rn(libdevice.exp(bz - zmax), S + tl.zeros_like(bz)), 0.0)
        pi = p[:, None]
        pj = pb[None, :]
        ahead = (jb < npick)[None, :] & ((pj > pi) | ((pj == pi) &
                                                    (bid[None, :] < sid[:, None])))
        before += tl.sum(tl.where(ahead, pj, 0.0), axis=1)
        nahead += tl.sum(ahead.to(tl.int32), axis=1)
    first = nahead == 0
    kept = live & ((before < tp) | first)
    reached = tl.sum(p, axis=0) >= tp
    zb = tl.where(bound >= 0, bound, bound ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    p_out = tl.math.div_rn(libdevice.exp(zb - zmax), S)
    p_end = tl.min(tl.where(kept, p, float("inf")), axis=0)
    # Exact when the nucleus ends strictly above every id left out (or none is).
    exact = (bound == INT_MIN) | (reached & (p_end > p_out))
    pmin = tl.where(mp > 0.0, mp * tl.math.div_rn(1.0, S), -1.0)
    kept = kept & (p >= pmin)
    race = tl.where(kept, _race_score(p, sid, pos, k0, k1), float("-inf"))
    cm = tl.max(race, axis=0)
    tok = tl.min(tl.where(kept & (race == cm), sid, INT_MAX), axis=0)
    return tl.where(exact, tok, UNRESOLVED)


@triton.jit
def sample_merge_nucleus(chunk_max, chunk_arg, chunk_mass, cand_key, cand_id, slot, positions,
                         sampling_decision, seed, temperature, top_p, top_k, min_p, histogram,
                         selected, sampled, R, V, P, C, KM, KN, BLOCK_P: tl.constexpr,
                         BLOCK_C: tl.constexpr, KMAX: tl.constexpr, NMAX: tl.constexpr,
                         JB: tl.constexpr):
    """``sample_merge``, and top-p rows with no top-k whose nucleus lies inside their
    ``NMAX`` most probable candidates; other sampling rows marked UNRESOLVED; grid
    ``(R,)``."""
    r = tl.program_id(0)
    s = tl.load(slot + r)
    if s < 0:
        tl.store(sampled + r, -1)
    else:
        pp = tl.arange(0, BLOCK_P)
        vals = tl.load(chunk_max + r.to(tl.int64) * P + pp, mask=pp < P, other=float("-inf"))
        args = tl.load(chunk_arg + r.to(tl.int64) * P + pp, mask=pp < P, other=INT_MAX)
        best = tl.max(vals, axis=0)
        tok = tl.min(tl.where((pp < P) & (vals == best), args, INT_MAX), axis=0)
        temp = tl.load(temperature + r)
        k = tl.load(top_k + r)
        tp = tl.load(top_p + r)
        srow = selected + r.to(tl.int64) * 2 * NMAX
        if (temp > 0.0) & (best > float("-inf")):
            if (k > 0) & (k <= KMAX) & (k < V):
                tok = _merge_top_k(cand_key, cand_id, srow, r, P, k, best, temp, tp,
                                   tl.load(min_p + r), tl.load(positions + r),
                                   tl.load(seed + 2 * r), tl.load(seed + 2 * r + 1), BLOCK_C,
                                   KMAX)
            elif (tp < 1.0) & ((k <= 0) | (k >= V)):
                tok = _merge_nucleus(cand_key, cand_id, chunk_max, chunk_mass, srow, r, P, V,
                                     C, temp, tp, tl.load(min_p + r),
                                     tl.load(positions + r), tl.load(seed + 2 * r),
                                     tl.load(seed + 2 * r + 1), BLOCK_P, BLOCK_C, KMAX, NMAX,
                                     JB)
            else:
                tok = tok * 0 + UNRESOLVED
        tl.store(sampled + r, tok)
        if (tok != UNRESOLVED) & (tl.load(sampling_decision + r) != 0):
            tl.atomic_add(histogram + s.to(tl.int64) * V + tok, 1)


# The wide form's race (helios_tools.kernels.sampling_chunks: sample_race, sample_pick).
RACE_SHIFT = tl.constexpr(20)
RACE_SPLIT = tl.constexpr(7)


@triton.jit
def _row_normalizer(chunk_max, chunk_mass, r, P, temp, BLOCK_P: tl.constexpr):
    """(zmax, S) of row r from its chunks, as ``_merge_nucleus`` computes them."""
    pp = tl.arange(0, BLOCK_P)
    vals = tl.load(chunk_max + r.to(tl.int64) * P + pp, mask=pp < P, other=float("-inf"))
    mass = tl.load(chunk_mass + r.to(tl.int64) * P + pp, mask=pp < P, other=0.0)
    zmax = tl.math.div_rn(tl.max(vals, axis=0), temp)
    tops = tl.math.div_rn(vals, temp + tl.zeros_like(vals))
    scale = tl.where(vals > float("-inf"), libdevice.exp(tops - zmax), 0.0)
    return zmax, tl.sum(scale * mass, axis=0)


@triton.jit
def _raced(slot, sampled, temperature, top_k, r, V):
    """Whether row r is drawn by the race: live, left UNRESOLVED, sampled, no top-k."""
    k = tl.load(top_k + r)
    return ((tl.load(slot + r) >= 0) & (tl.load(sampled + r) == UNRESOLVED)
            & (tl.load(temperature + r) > 0.0) & ((k <= 0) | (k >= V)))


@triton.jit
def sample_race(logits, slot, positions, seed, temperature, top_k, min_p, presence, frequency,
                repetition, histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                chunk_mass, sampled, race_level, race_mass, race_best, race_arg, R, V, W32, C,
                NB, LEVEL, BLOCK_V: tl.constexpr, BLOCK_P: tl.constexpr, NSLOT: tl.constexpr,
                JB: tl.constexpr):
    """Per (row, chunk, probability slot) of the raced rows: mass, best race score (f64 as
    two i32 words) and its lowest id; grid ``(R, cdiv(V, BLOCK_V))``. The slots of each
    block of JB are reduced from a ``BLOCK_V x JB`` one-hot in registers; blocks outside
    the chunk's slot range store the empty values."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.cdiv(V, BLOCK_V)
    if _raced(slot, sampled, temperature, top_k, r, V):
        temp = tl.load(temperature + r)
        zmax, S = _row_normalizer(chunk_max, chunk_mass, r, P, temp, BLOCK_P)
        if LEVEL == 1:
            hi = tl.math.div_rn(1.0, S).to(tl.int32, bitcast=True)
            shift = hi * 0 + RACE_SHIFT
            if c == 0:
                tl.store(race_level + 2 * r, hi)
                tl.store(race_level + 2 * r + 1, shift)
        else:
            hi = tl.load(race_level + 2 * r)
            shift = tl.load(race_level + 2 * r + 1)
        if shift >= 0:
            s = tl.load(slot + r)
            idx = c * BLOCK_V + tl.arange(0, BLOCK_V)
            z = _chunk_z(logits, histogram, logit_bias, grammar_mask, use_bias, use_mask,
                         repetition, frequency, presence, r, s, idx, V, W32)
            zt = tl.math.div_rn(z, temp + tl.zeros_like(z))
            e = tl.where(zt > float("-inf"), libdevice.exp(zt - zmax), 0.0)
            p = tl.math.div_rn(e, S + tl.zeros_like(e))
            mp = tl.load(min_p + r)
            pmin = tl.where(mp > 0.0, mp * tl.math.div_rn(1.0, S), -1.0)
            score = _race_score(p, idx, tl.load(positions + r), tl.load(seed + 2 * r),
                                tl.load(seed + 2 * r + 1))
            score = tl.where((p >= pmin) & (idx < V), score, float("-inf"))
            pb = p.to(tl.int32, bitcast=True)
            j = tl.where(pb > hi, 0, tl.minimum(((hi - pb) >> shift) + 1, NSLOT - 1))
            j = tl.where(idx < V, j, NSLOT)  # past the vocabulary: in no slot
            jlo = tl.min(j, axis=0)
            jhi = tl.max(tl.where(idx < V, j, 0), axis=0)
            base = (r.to(tl.int64) * P + c) * NSLOT
            for j0 in range(0, NSLOT, JB):
                jj = j0 + tl.arange(0, JB)
                if (j0 + JB > jlo) & (j0 <= jhi):
                    m = j[:, None] == jj[None, :]
                    mass = tl.sum(tl.where(m, p[:, None], 0.0), axis=0)
                    best = tl.max(tl.where(m, score[:, None], float("-inf")), axis=0)
                    arg = tl.min(tl.where(m & (score[:, None] == best[None, :]), idx[:, None],
                                          INT_MAX), axis=0)
                else:
                    mass = tl.zeros([JB], tl.float32)
                    best = tl.zeros([JB], tl.float64) + float("-inf")
                    arg = tl.zeros([JB], tl.int32) + INT_MAX
                bits = best.to(tl.int64, bitcast=True)
                tl.store(race_mass + base + jj, mass)
                tl.store(race_best + 2 * (base + jj), bits.to(tl.int32))
                tl.store(race_best + 2 * (base + jj) + 1, (bits >> 32).to(tl.int32))
                tl.store(race_arg + base + jj, arg)


@triton.jit
def sample_pick(race_mass, race_best, race_arg, slot, sampling_decision, temperature, top_p,
                top_k, histogram, race_level, sampled, R, V, P, NB, LEVEL,
                BLOCK_P: tl.constexpr, NSLOT: tl.constexpr):
    """Each raced row's token when its slots prove it, else (level 1) the uncertain slot
    for level 2 or (level 2) nothing: the row stays UNRESOLVED; grid ``(R,)``."""
    r = tl.program_id(0)
    if _raced(slot, sampled, temperature, top_k, r, V):
        shift = tl.load(race_level + 2 * r + 1)
        if (LEVEL == 1) | (shift >= 0):
            pp = tl.arange(0, BLOCK_P)
            jj = tl.arange(0, NSLOT)
            at = (r.to(tl.int64) * P + pp[:, None]) * NSLOT + jj[None, :]
            live = (pp < P)[:, None] & (jj < NSLOT)[None, :]
            mass = tl.sum(tl.load(race_mass + at, mask=live, other=0.0), axis=0)
            lo = tl.load(race_best + 2 * at, mask=live, other=0)
            hw = tl.load(race_best + 2 * at + 1, mask=live, other=0)
            b = ((hw.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)).to(tl.float64,
                                                                               bitcast=True)
            b = tl.where(live, b, float("-inf"))
            a = tl.load(race_arg + at, mask=live, other=INT_MAX)
            best = tl.max(b, axis=0)
            arg = tl.min(tl.where(b == best[None, :], a, INT_MAX), axis=0)
            tp = tl.load(top_p + r)
            reach = (tl.cumsum(mass, axis=0) >= tp) & (tp < 1.0)
            e = tl.min(tl.where(reach, jj, NSLOT), axis=0)
            tin = tl.max(tl.where(jj < e, best, float("-inf")), axis=0)
            ain = tl.min(tl.where((jj < e) & (best == tin), arg, INT_MAX), axis=0)
            tu = tl.max(tl.where(jj == e, best, float("-inf")), axis=0)
            au = tl.min(tl.where(jj == e, arg, INT_MAX), axis=0)
            if (e == NSLOT) | (tu < tin) | ((tu == tin) & (ain < au)):
                tl.store(sampled + r, ain)
                if tl.load(sampling_decision + r) != 0:
                    tl.atomic_add(histogram + tl.load(slot + r).to(tl.int64) * V + ain, 1)
            elif LEVEL == 1:
                if (e >= 1) & (e <= NSLOT - 2):
                    hi = tl.load(race_level + 2 * r)
                    tl.store(race_level + 2 * r, hi - ((e - 1) << shift))
                    tl.store(race_level + 2 * r + 1, shift - RACE_SPLIT)
                else:
                    tl.store(race_level + 2 * r + 1, shift * 0 - 1)


# The candidate race (helios_tools.kernels.sampling_chunks: sample_chunks_mass,
# sample_race_top, sample_race_mass, sample_race_pick): the race's best scores first, then
# the nucleus test of those few ids only. Each chunk program reduces its BLOCK_V ids
# 3 x MTOP times (race_top) or once over a BLOCK_V x MTOP comparison (race_mass), where
# the slot race above reduces 128 slots per chunk at each of two levels.


@triton.jit
def sample_chunks_mass(logits, slot, temperature, top_k, presence, frequency, repetition,
                       histogram, logit_bias, use_bias, grammar_mask, use_mask, chunk_max,
                       chunk_arg, chunk_mass, cand_key, cand_id, R, V, W32, C, KM,
                       BLOCK_V: tl.constexpr, KMAX: tl.constexpr):
    """``sample_chunks``, plus the chunk's softmax mass relative to its own maximum for
    every sampled row with no top-k (the race's normalizer); grid
    ``(R, cdiv(V, BLOCK_V))``."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.cdiv(V, BLOCK_V)
    s = tl.load(slot + r)
    if s >= 0:
        idx = c * BLOCK_V + tl.arange(0, BLOCK_V)
        z = _chunk_z(logits, histogram, logit_bias, grammar_mask, use_bias, use_mask,
                     repetition, frequency, presence, r, s, idx, V, W32)
        cm = tl.max(z, axis=0)
        ci = tl.min(tl.where(z == cm, idx, INT_MAX), axis=0)
        at = r.to(tl.int64) * P + c
        tl.store(chunk_max + at, cm)
        tl.store(chunk_arg + at, ci)
        temp = tl.load(temperature + r)
        k = tl.load(top_k + r)
        if temp > 0.0:
            zt = tl.math.div_rn(z, temp + tl.zeros_like(z))
            if (k > 0) & (k <= KMAX) & (k < V):
                _store_candidates(zt, idx, V, k, cand_key, cand_id, at * KMAX, KMAX)
            elif (k <= 0) | (k >= V):
                tl.store(chunk_mass + at, _chunk_mass(zt, cm, temp))


@triton.jit
def _race_zt(logits, slot, temperature, presence, frequency, repetition, histogram,
             logit_bias, use_bias, grammar_mask, use_mask, r, idx, V, W32):
    """Scaled logits ``z / T`` of ids ``idx`` of row r (-inf masked or past V)."""
    z = _chunk_z(logits, histogram, logit_bias, grammar_mask, use_bias, use_mask, repetition,
                 frequency, presence, r, tl.load(slot + r), idx, V, W32)
    return tl.math.div_rn(z, tl.load(temperature + r) + tl.zeros_like(z))


@triton.jit
def _p_of(zt, zmax, S):
    """``race_p``: f32 ``exp(zt - zmax) / S``, 0 where zt is -inf."""
    e = tl.where(zt > float("-inf"), libdevice.exp(zt - zmax), 0.0)
    return tl.math.div_rn(e, S + tl.zeros_like(e))


@triton.jit
def sample_race_top(logits, slot, positions, seed, temperature, top_k, min_p, presence,
                    frequency, repetition, histogram, logit_bias, use_bias, grammar_mask,
                    use_mask, chunk_max, chunk_mass, sampled, top_score, top_id, top_zt, R,
                    V, W32, C, M, BLOCK_V: tl.constexpr, BLOCK_P: tl.constexpr,
                    MTOP: tl.constexpr):
    """Per (row, chunk) of the raced rows: the MTOP best race scores (f64 as two i32
    words), best first, ties to the lower id, with their ids and scaled logits; grid
    ``(R, cdiv(V, BLOCK_V))``."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.cdiv(V, BLOCK_V)
    if _raced(slot, sampled, temperature, top_k, r, V):
        zmax, S = _row_normalizer(chunk_max, chunk_mass, r, P, tl.load(temperature + r),
                                  BLOCK_P)
        idx = c * BLOCK_V + tl.arange(0, BLOCK_V)
        zt = _race_zt(logits, slot, temperature, presence, frequency, repetition, histogram,
                      logit_bias, use_bias, grammar_mask, use_mask, r, idx, V, W32)
        p = _p_of(zt, zmax, S)  # race_probabilities
        mp = tl.load(min_p + r)
        pmin = tl.where(mp > 0.0, mp * tl.math.div_rn(1.0, S), -1.0)
        score = _race_score(p, idx, tl.load(positions + r), tl.load(seed + 2 * r),
                            tl.load(seed + 2 * r + 1))
        score = tl.where((p >= pmin) & (idx < V), score, float("-inf"))
        base = (r.to(tl.int64) * P + c) * MTOP
        for m in tl.static_range(MTOP):
            best = tl.max(score, axis=0)
            arg = tl.min(tl.where((score == best) & (best > float("-inf")), idx, INT_MAX),
                         axis=0)
            # the candidate's scaled logit (-inf for a pad): sample_race_mass recomputes
            # its p with its own S, so every p it compares comes from one S
            prob = tl.max(tl.where(idx == arg, zt, float("-inf")), axis=0)
            bits = best.to(tl.int64, bitcast=True)
            tl.store(top_score + 2 * (base + m), bits.to(tl.int32))
            tl.store(top_score + 2 * (base + m) + 1, (bits >> 32).to(tl.int32))
            tl.store(top_id + base + m, arg)
            tl.store(top_zt + base + m, prob)
            score = tl.where(idx == arg, float("-inf"), score)


@triton.jit
def _race_candidates(top_score, top_id, top_zt, r, P, BLOCK_Q: tl.constexpr,
                     MTOP: tl.constexpr):
    """Row r's MTOP best race scores over its chunks' (ties: lower id), best first:
    (scores f64, ids, scaled logits), each an MTOP vector (``race_candidates``)."""
    q = tl.arange(0, BLOCK_Q)
    live = q < P * MTOP
    at = r.to(tl.int64) * P * MTOP + q
    lo = tl.load(top_score + 2 * at, mask=live, other=0)
    hw = tl.load(top_score + 2 * at + 1, mask=live, other=0)
    sc = ((hw.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)).to(tl.float64,
                                                                       bitcast=True)
    sc = tl.where(live, sc, float("-inf"))
    ids = tl.load(top_id + at, mask=live, other=INT_MAX)
    pr = tl.load(top_zt + at, mask=live, other=float("-inf"))
    jm = tl.arange(0, MTOP)
    out_s = tl.zeros([MTOP], tl.float64) + float("-inf")
    out_i = tl.zeros([MTOP], tl.int32) + INT_MAX
    out_p = tl.zeros([MTOP], tl.float32) + float("-inf")
    for m in tl.static_range(MTOP):
        best = tl.max(sc, axis=0)
        arg = tl.min(tl.where(sc == best, ids, INT_MAX), axis=0)
        hit = (sc == best) & (ids == arg)  # one lane for a real id; pads are all alike
        prob = tl.max(tl.where(hit, pr, float("-inf")), axis=0)
        out_s = tl.where(jm == m, best, out_s)
        out_i = tl.where(jm == m, arg, out_i)
        out_p = tl.where(jm == m, prob, out_p)
        # Taken: now a pad (-inf, INT_MAX, -inf) like the chunks' own, so a later pad
        # pick reads a pad's scaled logit.
        sc = tl.where(hit, float("-inf"), sc)
        ids = tl.where(hit, INT_MAX, ids)
        pr = tl.where(hit, float("-inf"), pr)
    return out_s, out_i, out_p


@triton.jit
def sample_race_mass(logits, slot, temperature, top_p, top_k, min_p, presence, frequency,
                     repetition, histogram, logit_bias, use_bias, grammar_mask, use_mask,
                     chunk_max, chunk_mass, sampled, top_score, top_id, top_zt, ahead, R, V,
                     W32, C, M, BLOCK_V: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_Q: tl.constexpr, MTOP: tl.constexpr):
    """Per (row, chunk) of the raced rows with top_p < 1: the chunk's probability mass
    ahead of each of the row's MTOP race candidates (p descending, ties: lower id), one
    ``BLOCK_V x MTOP`` comparison; grid ``(R, cdiv(V, BLOCK_V))``."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.cdiv(V, BLOCK_V)
    if _raced(slot, sampled, temperature, top_k, r, V) & (tl.load(top_p + r) < 1.0):
        _, cid, cz = _race_candidates(top_score, top_id, top_zt, r, P, BLOCK_Q, MTOP)
        zmax, S = _row_normalizer(chunk_max, chunk_mass, r, P, tl.load(temperature + r),
                                  BLOCK_P)
        cp = _p_of(cz, zmax, S)
        idx = c * BLOCK_V + tl.arange(0, BLOCK_V)
        p = _p_of(_race_zt(logits, slot, temperature, presence, frequency, repetition,
                           histogram, logit_bias, use_bias, grammar_mask, use_mask, r, idx, V,
                           W32), zmax, S)
        pi = p[:, None]
        pc = cp[None, :]
        before = (pi > pc) | ((pi == pc) & (idx[:, None] < cid[None, :]))
        mass = tl.sum(tl.where(before, pi, 0.0), axis=0)
        tl.store(ahead + (r.to(tl.int64) * P + c) * MTOP + tl.arange(0, MTOP), mass)


@triton.jit
def sample_race_pick(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                     top_k, min_p, presence, frequency, repetition, histogram, logit_bias,
                     use_bias, grammar_mask, use_mask, top_score, top_id, top_zt, ahead,
                     sampled, R, V, W32, P, M, BLOCK_V: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_Q: tl.constexpr, MTOP: tl.constexpr):
    """Every row still UNRESOLVED: a raced row's first candidate inside its nucleus (its
    mass ahead below top_p, or none ahead), else ``sample_biased``'s row (as
    ``sample_rest``); every other row returns at once; grid ``(R,)``."""
    r = tl.program_id(0)
    if tl.load(sampled + r) == UNRESOLVED:
        tok = r * 0 + UNRESOLVED
        if _raced(slot, sampled, temperature, top_k, r, V):
            cs, cid, _ = _race_candidates(top_score, top_id, top_zt, r, P, BLOCK_Q, MTOP)
            jm = tl.arange(0, MTOP)
            tp = tl.load(top_p + r)
            inside = jm >= 0
            if tp < 1.0:
                pp = tl.arange(0, BLOCK_P)
                part = tl.load(ahead + (r.to(tl.int64) * P + pp[:, None]) * MTOP + jm[None, :],
                               mask=(pp < P)[:, None] & (jm >= 0)[None, :], other=0.0)
                before = tl.sum(part, axis=0)
                inside = (before < tp) | (before == 0.0)
            ok = inside & (cs > float("-inf"))
            first = tl.min(tl.where(ok, jm, MTOP), axis=0)
            won = tl.min(tl.where(jm == first, cid, INT_MAX), axis=0)
            tok = tl.where(first < MTOP, won, tok)
        if tok != UNRESOLVED:
            tl.store(sampled + r, tok)
            if tl.load(sampling_decision + r) != 0:
                tl.atomic_add(histogram + tl.load(slot + r).to(tl.int64) * V + tok, 1)
        else:
            _sample_entry(logits, slot, positions, sampling_decision, seed, temperature,
                          top_p, top_k, min_p, presence, frequency, repetition, histogram,
                          logit_bias, use_bias, grammar_mask, use_mask, sampled, V, W32, True,
                          BLOCK_V)
