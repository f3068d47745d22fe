"""Triton sampler: logit bias, penalties, grammar mask, temperature, top-k / top-p / min-p,
Philox draw; and the raw-distribution logprobs.

Same parameters and semantics as ``helios_tools.kernels.sample_biased`` (and ``sample``,
the op of cores exported before logit bias: the same row body with no bias) and
``token_logprobs``; one program per submission row (grid ``(R,)``), sweeping the
vocabulary in ``BLOCK_V`` chunks. The row bodies ``_sample_row`` and ``_row_logprobs``
are ``@triton.jit`` helpers a speculative verify kernel can call per position. Nothing
is sorted: the k-th largest scaled logit and the top-p threshold are found by bisection
over order-preserving integer keys of the f32 values (each probe one counting sweep),
and ties at a threshold keep the lowest ids (another bisection over the id). The draw is
the reference's exponential race ``argmax log p_i - log(-log u_i)`` in float64 with
``u_i = Philox4x32-10(key=seed, counter=(i, position, 0, 0))``, so a row's token never
depends on its neighbours. Greedy rows (temperature <= 0) cost one sweep.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

INT_MAX = tl.constexpr(2147483647)


@triton.jit
def _key(x):
    """Order-preserving int32 key of f32 values (``a < b`` <=> ``key(a) < key(b)``)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _logits(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres):
    """Biased, penalized, masked f32 logits of ids ``idx`` (``-inf`` past V or masked
    out). The bias, histogram and mask loads are predicated off for rows that do not use
    them (no memory traffic)."""
    inside = idx < V
    z = tl.load(lrow + idx, mask=inside, other=0.0)
    z = z + tl.load(brow + idx, mask=inside & (ub != 0), other=0.0)
    # The histogram is read only where a penalty uses it (an unpenalized row's counts
    # change nothing below): 4 bytes per id fewer for most rows, in every sampler pass.
    penalized = (rep != 1.0) | (freq != 0.0) | (pres != 0.0)
    c = tl.load(hrow + idx, mask=inside & penalized, other=0)
    seen = c > 0
    zr = tl.where(z > 0, tl.math.div_rn(z, rep + tl.zeros_like(z)), z * rep)
    z = tl.where(seen & (rep != 1.0), zr, z)
    z = z - freq * c.to(tl.float32)
    z = z - pres * seen.to(tl.float32)
    w = tl.load(mrow + idx // 32, mask=inside & (um != 0), other=-1)
    allowed = ((w >> (idx % 32)) & 1) != 0
    return tl.where(inside & allowed, z, float("-inf"))


@triton.jit
def _scaled(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres, temp):
    z = _logits(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres)
    return tl.math.div_rn(z, temp + tl.zeros_like(z))


@triton.jit
def _philox(idx, pos, stream, k0, k1):
    """Uniforms ``((x0 >> 8) + 0.5) * 2**-24`` (f64) of Philox4x32-10, key (k0, k1),
    counter (idx, pos, stream, 0): ``helios_tools.kernels.rng.philox_uniform``."""
    c0 = idx.to(tl.uint32, bitcast=True)
    c1 = tl.zeros_like(c0) + pos.to(tl.uint32, bitcast=True)
    c2 = tl.zeros_like(c0) + stream.to(tl.uint32, bitcast=True)
    c3 = tl.zeros_like(c0)
    m0 = tl.full(c0.shape, 0xD2511F53, tl.uint32)
    m1 = tl.full(c0.shape, 0xCD9E8D57, tl.uint32)
    a0 = k0
    a1 = k1
    for rnd in tl.static_range(10):
        if rnd > 0:
            a0 = a0 + 0x9E3779B9
            a1 = a1 + 0xBB67AE85
        hi0 = tl.math.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.math.umulhi(m1, c2)
        lo1 = m1 * c2
        n0 = hi1 ^ c1 ^ a0
        n2 = hi0 ^ c3 ^ a1
        c0 = n0
        c1 = lo1
        c2 = n2
        c3 = lo0
    return ((c0 >> 8).to(tl.float64) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _philox_u(idx, pos, k0, k1):
    """The sampler's uniforms: ``_philox`` on stream 0."""
    return _philox(idx, pos, idx * 0, k0, k1)


@triton.jit
def _race_score(p, idx, pos, k0, k1):
    """The exponential race's score ``log p_i - log(-log u_i)`` (f64) of ids ``idx`` with
    weights ``p``, ``u_i = _philox_u(idx_i, pos)``: the one noise function of the
    sampler's draw and of a coupled draft (kernels_triton/speculative.py), as the
    reference's ``sampling._race``. The winner is the first id of the largest score."""
    u = _philox_u(idx, pos, k0, k1)
    return libdevice.log(p.to(tl.float64)) - libdevice.log(-libdevice.log(u))


@triton.jit
def _id_cutoff(lrow, hrow, brow, mrow, V, ub, um, rep, freq, pres, temp, zmax, S, kkey, kcut,
               key_eq, use_p, need, BLOCK_V: tl.constexpr):
    """Smallest id c with ``count(tied & id <= c) >= need``; ``tied`` is ``key == key_eq``
    on the scaled logits (``use_p == 0``) or on the probabilities of top-k candidates."""
    lanes = tl.arange(0, BLOCK_V)
    lo = tl.min(tl.zeros_like(lanes), axis=0)
    hi = V - 1 + lo
    for _ in range(21):
        mid = (lo + hi) // 2
        cnt = tl.min(tl.zeros_like(lanes), axis=0)
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + lanes
            zt = _scaled(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres, temp)
            if use_p == 0:
                tied = _key(zt) == key_eq
            else:
                kz = _key(zt)
                cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
                p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
                tied = cand & (p.to(tl.int32, bitcast=True) == key_eq)
            cnt += tl.sum((tied & (idx <= mid)).to(tl.int32), axis=0)
        go_left = cnt >= need
        hi = tl.where((lo < hi) & go_left, mid, hi)
        lo = tl.where((lo < hi) & (~go_left), mid + 1, lo)
    return lo


@triton.jit
def _sample_row(lrow, hrow, brow, mrow, V, ub, um, rep, freq, pres, temp, k, tp, mp, pos,
                k0, k1, BLOCK_V: tl.constexpr):
    """The sampled id of one row (see ``sample_biased``); the row's buffers start at
    ``lrow`` (logits), ``hrow`` (histogram), ``brow`` (logit bias, read when ``ub != 0``)
    and ``mrow`` (grammar mask words, read when ``um != 0``)."""
    lanes = tl.arange(0, BLOCK_V)
    fzero = tl.sum(tl.zeros((BLOCK_V,), tl.float32), axis=0)
    izero = tl.min(tl.zeros_like(lanes), axis=0)
    # Sweep 1: greedy argmax (first index on ties) of the biased, penalized, masked logits.
    best_v = fzero + float("-inf")
    best_i = izero
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + lanes
        z = _logits(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres)
        cm = tl.max(z, axis=0)
        ci = tl.min(tl.where(z == cm, idx, INT_MAX), axis=0)
        best_i = tl.where(cm > best_v, ci, best_i)
        best_v = tl.maximum(best_v, cm)
    tok = best_i
    if (temp > 0.0) & (best_v > float("-inf")):
        zmax = tl.math.div_rn(best_v, temp)
        # top-k: kkey = key of the k-th largest scaled logit; ties keep ids <= kcut.
        kkey = izero - 2147483647 - 1
        kcut = izero + V
        if (k > 0) & (k < V):
            lo = kkey.to(tl.int64)
            hi = lo * 0 + 2147483647
            for _ in range(32):
                mid = lo + (hi - lo + 1) // 2
                cnt = izero
                for v0 in range(0, V, BLOCK_V):
                    zt = _scaled(lrow, hrow, brow, mrow, v0 + lanes, V, ub, um, rep, freq,
                                 pres, temp)
                    cnt += tl.sum((_key(zt).to(tl.int64) >= mid).to(tl.int32), axis=0)
                ok = cnt >= k
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            kkey = lo.to(tl.int32)
            gt = izero
            eq = izero
            for v0 in range(0, V, BLOCK_V):
                kz = _key(_scaled(lrow, hrow, brow, mrow, v0 + lanes, V, ub, um, rep, freq,
                                  pres, temp))
                gt += tl.sum((kz > kkey).to(tl.int32), axis=0)
                eq += tl.sum((kz == kkey).to(tl.int32), axis=0)
            if eq > k - gt:
                kcut = _id_cutoff(lrow, hrow, brow, mrow, V, ub, um, rep, freq, pres, temp,
                                  zmax, fzero + 1.0, kkey, kcut, kkey, 0, k - gt, BLOCK_V)
        # Softmax denominator over the candidates.
        S = fzero
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + lanes
            zt = _scaled(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres, temp)
            kz = _key(zt)
            cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
            S += tl.sum(tl.where(cand, libdevice.exp(zt - zmax), 0.0), axis=0)
        # top-p: pkey = bits of the smallest kept probability; ties keep ids <= pcut.
        pkey = izero - 1
        pcut = izero + V
        if tp < 1.0:
            lo = izero
            hi = izero + 0x3F800000
            for _ in range(31):
                mid = lo + (hi - lo + 1) // 2
                mass = fzero
                for v0 in range(0, V, BLOCK_V):
                    idx = v0 + lanes
                    zt = _scaled(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres,
                                 temp)
                    kz = _key(zt)
                    cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
                    p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
                    pb = p.to(tl.int32, bitcast=True)
                    mass += tl.sum(tl.where(cand & (pb >= mid), p, 0.0), axis=0)
                ok = mass >= tp
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            mgt = fzero
            eq = izero
            mall = fzero
            for v0 in range(0, V, BLOCK_V):
                idx = v0 + lanes
                zt = _scaled(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres, temp)
                kz = _key(zt)
                cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
                p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
                pb = p.to(tl.int32, bitcast=True)
                mgt += tl.sum(tl.where(cand & (pb > lo), p, 0.0), axis=0)
                eq += tl.sum((cand & (pb == lo)).to(tl.int32), axis=0)
                mall += tl.sum(tl.where(cand, p, 0.0), axis=0)
            if mall >= tp:
                pkey = lo
                tau = lo.to(tl.float32, bitcast=True)
                need = libdevice.ceil(tl.math.div_rn(tp - mgt, tau)).to(tl.int32)
                need = tl.minimum(tl.maximum(need, 1), eq)
                if eq > need:
                    pcut = _id_cutoff(lrow, hrow, brow, mrow, V, ub, um, rep, freq, pres,
                                      temp, zmax, S, kkey, kcut, lo, 1, need, BLOCK_V)
        pmin = tl.where(mp > 0.0, mp * tl.math.div_rn(1.0, S), -1.0)
        # The race, in float64.
        best_race = fzero.to(tl.float64) + float("-inf")
        best_tok = izero
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + lanes
            zt = _scaled(lrow, hrow, brow, mrow, idx, V, ub, um, rep, freq, pres, temp)
            kz = _key(zt)
            keep = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
            p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
            pb = p.to(tl.int32, bitcast=True)
            keep = keep & ((pb > pkey) | ((pb == pkey) & (idx <= pcut))) & (p >= pmin)
            keep = keep & (idx < V)
            race = tl.where(keep, _race_score(p, idx, pos, k0, k1), float("-inf"))
            cm = tl.max(race, axis=0)
            ci = tl.min(tl.where(keep & (race == cm), idx, INT_MAX), axis=0)
            better = cm > best_race
            best_tok = tl.where(better, ci, best_tok)
            best_race = tl.maximum(best_race, cm)
        tok = best_tok
    return tok


@triton.jit
def _sample_entry(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                  top_k, min_p, presence, frequency, repetition, histogram, logit_bias,
                  use_bias, grammar_mask, use_mask, sampled, V, W32, BIASED: tl.constexpr,
                  BLOCK_V: tl.constexpr):
    r = tl.program_id(0)
    s = tl.load(slot + r)
    if s < 0:
        tl.store(sampled + r, -1)
    else:
        lrow = logits + r.to(tl.int64) * V
        hrow = histogram + s.to(tl.int64) * V
        mrow = grammar_mask + r.to(tl.int64) * W32
        if BIASED:
            ub = tl.load(use_bias + r)
            brow = logit_bias + s.to(tl.int64) * V
        else:  # no bias buffer: the predicated-off loads never touch `brow`
            ub = s * 0
            brow = lrow
        tok = _sample_row(lrow, hrow, brow, mrow, V, ub, tl.load(use_mask + r),
                          tl.load(repetition + r), tl.load(frequency + r),
                          tl.load(presence + r), tl.load(temperature + r), tl.load(top_k + r),
                          tl.load(top_p + r), tl.load(min_p + r), tl.load(positions + r),
                          tl.load(seed + 2 * r), tl.load(seed + 2 * r + 1), BLOCK_V)
        tl.store(sampled + r, tok)
        if tl.load(sampling_decision + r) != 0:
            tl.atomic_add(hrow + tok, 1)


@triton.jit
def sample_biased(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                  top_k, min_p, presence, frequency, repetition, histogram, logit_bias,
                  use_bias, grammar_mask, use_mask, sampled, R, V, W32,
                  BLOCK_V: tl.constexpr):
    """Sample one token per row (logit bias first) and count it in the row's histogram;
    grid ``(R,)``."""
    _sample_entry(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                  top_k, min_p, presence, frequency, repetition, histogram, logit_bias,
                  use_bias, grammar_mask, use_mask, sampled, V, W32, True, BLOCK_V)


@triton.jit
def sample(logits, slot, positions, sampling_decision, seed, temperature, top_p, top_k,
           min_p, presence, frequency, repetition, histogram, grammar_mask, use_mask,
           sampled, R, V, W32, BLOCK_V: tl.constexpr):
    """``sample_biased`` without logit bias (cores exported before it); grid ``(R,)``."""
    _sample_entry(logits, slot, positions, sampling_decision, seed, temperature, top_p,
                  top_k, min_p, presence, frequency, repetition, histogram, histogram,
                  use_mask, grammar_mask, use_mask, sampled, V, W32, False, BLOCK_V)


INT64_MIN = tl.constexpr(-9223372036854775808)
INT64_MAX = tl.constexpr(9223372036854775807)


@triton.jit
def _row_logprobs(lrow, tok, k, orow, irow, V, BLOCK_V: tl.constexpr):
    """One row of ``token_logprobs``: ``orow[0]`` = logprob of ``tok``; the ``k`` largest
    logits' ids to ``irow[:k]`` and logprobs to ``orow[1:1 + k]``.

    log_softmax of the raw logits, normalizer ``max + log(sum(exp(z - max)))`` in f32.
    Top-k by k successive maxima of a packed int64 key ``key(z) << 32 | (INT_MAX - id)``
    strictly below the previous one: larger logit first, ties to the lower id, exact, and
    k + 2 sweeps of the (L2-resident) row.
    """
    lanes = tl.arange(0, BLOCK_V)
    fzero = tl.sum(tl.zeros((BLOCK_V,), tl.float32), axis=0)
    m = fzero + float("-inf")
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + lanes
        z = tl.load(lrow + idx, mask=idx < V, other=float("-inf"))
        m = tl.maximum(m, tl.max(z, axis=0))
    total = fzero
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + lanes
        z = tl.load(lrow + idx, mask=idx < V, other=float("-inf"))
        total += tl.sum(tl.where(idx < V, libdevice.exp(z - m), 0.0), axis=0)
    lse = m + libdevice.log(total)
    tl.store(orow, tl.load(lrow + tok) - lse)
    prev = (fzero.to(tl.int64) * 0) + INT64_MAX
    for j in range(0, k):
        best = prev * 0 + INT64_MIN
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + lanes
            z = tl.load(lrow + idx, mask=idx < V, other=float("-inf"))
            packed = (_key(z).to(tl.int64) << 32) | (INT_MAX - idx).to(tl.int64)
            packed = tl.where((idx < V) & (packed < prev), packed, INT64_MIN)
            best = tl.maximum(best, tl.max(packed, axis=0))
        prev = best
        i = INT_MAX - (best & 0x7FFFFFFF).to(tl.int32)
        tl.store(irow + j, i)
        tl.store(orow + 1 + j, tl.load(lrow + i) - lse)


@triton.jit
def token_logprobs(logits, slot, sampled, logprobs_k, logprobs, top_ids, R, V, K,
                   BLOCK_V: tl.constexpr):
    """Raw-distribution logprobs of the sampled token and the top-k per row; grid ``(R,)``.
    Rows with ``slot < 0`` or ``logprobs_k < 0`` write nothing."""
    r = tl.program_id(0)
    k = tl.load(logprobs_k + r)
    if (tl.load(slot + r) >= 0) & (k >= 0):
        _row_logprobs(logits + r.to(tl.int64) * V, tl.load(sampled + r), tl.minimum(k, K),
                      logprobs + r.to(tl.int64) * (K + 1), top_ids + r.to(tl.int64) * K, V,
                      BLOCK_V)


@triton.jit
def score_tokens(logits, targets, scores, score_ids, T, V, K, BLOCK_V: tl.constexpr):
    """Prompt scores of a SCORED_PREFILL program: per packed token with a target (>= 0)
    the raw-distribution logprob of the target and the top-K; grid ``(T,)``. The row
    sweep is ``token_logprobs``'s (``_row_logprobs``); tokens with target -1 write
    nothing."""
    t = tl.program_id(0)
    target = tl.load(targets + t)
    if target >= 0:
        _row_logprobs(logits + t.to(tl.int64) * V, target, K,
                      scores + t.to(tl.int64) * (K + 1), score_ids + t.to(tl.int64) * K, V,
                      BLOCK_V)
