"""Triton kernels of the speculative ops (semantics: helios_tools.kernels.speculative).

The draft and verify kernels run one program per lane and sweep the vocabulary in
BLOCK_V chunks with the sampler's own helpers (kernels_triton/sampling.py): thresholds
of top-k / top-p by bisection over order-preserving keys, min-p, and the exponential
race in float64 over Philox4x32-10 uniforms. Coupled programs (`draft_sample_coupled`,
`spec_verify_coupled`) score both races with the sampler's `_race_score` (stream 0):
the verify's token at each row is the decode sampler's draw, the head's draft is the
race over its own distribution with the same noise. The ops of cores exported before
coupling (`draft_sample`, `spec_verify`, `spec_copy_candidates`) use counter word 2 =
the RNG stream (0 target, 1 draft, 2 accept, 3 residual). The verify kernels walk a
lane's rows in order; the tokens emitted so far in the lane are counted into the
penalties from registers (the histogram row is updated once, at the end of the lane).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from .sampling import INT_MAX, _key, _philox, _race_score

RECORD_FIELDS = tl.constexpr(6)


@triton.jit
def spec_draft_inputs(pending, slot, lane_start, query_length, drafts, tok, pos, row,
                      lane_slot, B, S, DMAX, STEP, BLOCK: tl.constexpr):
    """Inputs of draft step STEP per lane; grid ``(cdiv(B, BLOCK),)``."""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = b < B
    s = tl.load(slot + b, mask=inb, other=-1)
    n = tl.load(query_length + b, mask=inb, other=0)
    live = inb & (s >= 0) & (s < S) & ((STEP == 1) | (n > STEP))
    first = tl.load(pending + s, mask=live & (STEP == 1), other=-1)
    later = tl.load(drafts + b * DMAX + (STEP - 2), mask=live & (STEP > 1), other=-1)
    start = tl.load(lane_start + b, mask=inb, other=0)
    tl.store(tok + b, tl.where(live, tl.where(STEP == 1, first, later), -1), mask=inb)
    tl.store(pos + b, tl.where(live, start + STEP - 1, 0), mask=inb)
    tl.store(row + b, tl.where(live, b, -1), mask=inb)
    tl.store(lane_slot + b, tl.where(live, s, -1), mask=inb)


@triton.jit
def spec_pack_tokens(pending, slot, lane_start, drafts, positions, token_row, tokens, B, P, S,
                     DMAX, BLOCK: tl.constexpr):
    """Target token of each packed verification row; grid ``(cdiv(P, BLOCK),)``."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inp = t < P
    b = tl.load(token_row + t, mask=inp, other=-1)
    real = inp & (b >= 0)
    s = tl.load(slot + b, mask=real, other=-1)
    real = real & (s >= 0) & (s < S)
    j = tl.load(positions + t, mask=real, other=0) - tl.load(lane_start + b, mask=real, other=0)
    first = tl.load(pending + s, mask=real & (j == 0), other=-1)
    drafted = tl.load(drafts + b * DMAX + (j - 1), mask=real & (j > 0), other=-1)
    tl.store(tokens + t, tl.where(real, tl.where(j == 0, first, drafted), -1), mask=inp)


@triton.jit
def paged_row_write(x, positions, token_row, slot, page_table, plane, T, R, MP, PT, D,
                    BLOCK_D: tl.constexpr):
    """Store row t of x at its token's position; grid ``(T,)``."""
    t = tl.program_id(0)
    r = tl.load(token_row + t)
    s = tl.load(slot + r, mask=r >= 0, other=-1)
    if (r >= 0) & (s >= 0):
        p = tl.load(positions + t)
        page = tl.load(page_table + s.to(tl.int64) * MP + p // PT).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        v = tl.load(x + t.to(tl.int64) * D + d, mask=d < D)
        tl.store(plane + (page * PT + p % PT) * D + d, v, mask=d < D)


@triton.jit
def paged_row_gather_prev(plane, positions, token_row, slot, page_table, out, T, R, MP, PT, D,
                          BLOCK_D: tl.constexpr):
    """Row of the previous position of each token (zeros at position 0 or padding);
    grid ``(T,)``."""
    t = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    r = tl.load(token_row + t)
    s = tl.load(slot + r, mask=r >= 0, other=-1)
    p = tl.load(positions + t) - 1
    v = tl.zeros((BLOCK_D,), tl.float32)
    if (r >= 0) & (s >= 0) & (p >= 0):
        page = tl.load(page_table + s.to(tl.int64) * MP + p // PT).to(tl.int64)
        v = tl.load(plane + (page * PT + p % PT) * D + d, mask=d < D, other=0.0)
    tl.store(out + t.to(tl.int64) * D + d, v, mask=d < D)


@triton.jit
def _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp,
       PENALIZE: tl.constexpr, WMAX: tl.constexpr):
    """Scaled logits of ids `idx`: penalties over the histogram row plus the lane's
    emitted ids `out_ids` ([WMAX], -1 padding), the grammar mask when `um`, then / temp."""
    inside = idx < V
    z = tl.load(lrow + idx, mask=inside, other=0.0)
    if PENALIZE:
        c = tl.load(hrow + idx, mask=inside, other=0)
        c += tl.sum((idx[:, None] == out_ids[None, :]).to(tl.int32), axis=1)
        seen = c > 0
        zr = tl.where(z > 0, tl.math.div_rn(z, rep + tl.zeros_like(z)), z * rep)
        z = tl.where(seen & (rep != 1.0), zr, z)
        z = z - freq * c.to(tl.float32)
        z = z - pres * seen.to(tl.float32)
        w = tl.load(mrow + idx // 32, mask=inside & (um != 0), other=-1)
        inside = inside & (((w >> (idx % 32)) & 1) != 0)
    z = tl.where(inside, z, float("-inf"))
    return tl.math.div_rn(z, temp + tl.zeros_like(z))


@triton.jit
def _thresholds(lrow, hrow, mrow, V, um, rep, freq, pres, out_ids, temp, zmax, k, tp, mp,
                PENALIZE: tl.constexpr, WMAX: tl.constexpr, BLOCK_V: tl.constexpr):
    """The sampler's truncation of one row (sampling.py, same bisections): returns
    (kkey, kcut, S, pkey, pcut, pmin, S_keep); id i is kept iff `_kept(...)`, with
    probability exp(z_i - zmax) / S (renormalized: / S_keep)."""
    lanes = tl.arange(0, BLOCK_V)
    fzero = tl.sum(tl.zeros((BLOCK_V,), tl.float32), axis=0)
    izero = tl.min(tl.zeros_like(lanes), axis=0)
    kkey = izero - 2147483647 - 1
    kcut = izero + V
    if (k > 0) & (k < V):
        lo = kkey.to(tl.int64)
        hi = lo * 0 + 2147483647
        for _ in range(32):
            mid = lo + (hi - lo + 1) // 2
            cnt = izero
            for v0 in range(0, V, BLOCK_V):
                zt = _z(lrow, hrow, mrow, v0 + lanes, V, um, rep, freq, pres, out_ids, temp,
                        PENALIZE, WMAX)
                cnt += tl.sum((_key(zt).to(tl.int64) >= mid).to(tl.int32), axis=0)
            ok = cnt >= k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        kkey = lo.to(tl.int32)
        gt = izero
        eq = izero
        for v0 in range(0, V, BLOCK_V):
            kz = _key(_z(lrow, hrow, mrow, v0 + lanes, V, um, rep, freq, pres, out_ids, temp,
                         PENALIZE, WMAX))
            gt += tl.sum((kz > kkey).to(tl.int32), axis=0)
            eq += tl.sum((kz == kkey).to(tl.int32), axis=0)
        if eq > k - gt:  # ties at the k-th value keep the lowest ids
            need = k - gt
            clo = izero
            chi = V - 1 + izero
            for _ in range(21):
                cmid = (clo + chi) // 2
                cnt = izero
                for v0 in range(0, V, BLOCK_V):
                    idx = v0 + lanes
                    kz = _key(_z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp,
                                 PENALIZE, WMAX))
                    cnt += tl.sum(((kz == kkey) & (idx <= cmid)).to(tl.int32), axis=0)
                left = cnt >= need
                chi = tl.where((clo < chi) & left, cmid, chi)
                clo = tl.where((clo < chi) & (~left), cmid + 1, clo)
            kcut = clo
    S = fzero
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + lanes
        zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp, PENALIZE, WMAX)
        kz = _key(zt)
        cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
        S += tl.sum(tl.where(cand, libdevice.exp(zt - zmax), 0.0), axis=0)
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
                zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp, PENALIZE,
                        WMAX)
                kz = _key(zt)
                cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
                p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
                mass += tl.sum(tl.where(cand & (p.to(tl.int32, bitcast=True) >= mid), p, 0.0),
                               axis=0)
            ok = mass >= tp
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        mgt = fzero
        eq = izero
        mall = fzero
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + lanes
            zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp, PENALIZE, WMAX)
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
                clo = izero
                chi = V - 1 + izero
                for _ in range(21):
                    cmid = (clo + chi) // 2
                    cnt = izero
                    for v0 in range(0, V, BLOCK_V):
                        idx = v0 + lanes
                        zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp,
                                PENALIZE, WMAX)
                        kz = _key(zt)
                        cand = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
                        p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
                        tied = cand & (p.to(tl.int32, bitcast=True) == lo)
                        cnt += tl.sum((tied & (idx <= cmid)).to(tl.int32), axis=0)
                    left = cnt >= need
                    chi = tl.where((clo < chi) & left, cmid, chi)
                    clo = tl.where((clo < chi) & (~left), cmid + 1, clo)
                pcut = clo
    pmin = tl.where(mp > 0.0, mp * tl.math.div_rn(1.0, S), -1.0)
    S_keep = fzero
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + lanes
        zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp, PENALIZE, WMAX)
        p, keep = _kept(zt, idx, V, zmax, S, kkey, kcut, pkey, pcut, pmin)
        S_keep += tl.sum(tl.where(keep, p, 0.0), axis=0)
    return kkey, kcut, S, pkey, pcut, pmin, S_keep


@triton.jit
def _kept(zt, idx, V, zmax, S, kkey, kcut, pkey, pcut, pmin):
    """(p, kept) of ids `idx` under the thresholds of `_thresholds` (p not renormalized)."""
    kz = _key(zt)
    keep = (kz > kkey) | ((kz == kkey) & (idx <= kcut))
    p = tl.math.div_rn(libdevice.exp(zt - zmax), S + tl.zeros_like(zt))
    pb = p.to(tl.int32, bitcast=True)
    keep = keep & ((pb > pkey) | ((pb == pkey) & (idx <= pcut))) & (p >= pmin) & (idx < V)
    return p, keep


@triton.jit
def _argmax(lrow, hrow, mrow, V, um, rep, freq, pres, out_ids, PENALIZE: tl.constexpr,
            WMAX: tl.constexpr, BLOCK_V: tl.constexpr):
    """(first argmax, max) of the penalized, masked logits."""
    lanes = tl.arange(0, BLOCK_V)
    best_v = tl.sum(tl.zeros((BLOCK_V,), tl.float32), axis=0) + float("-inf")
    best_i = tl.min(tl.zeros_like(lanes), axis=0)
    for v0 in range(0, V, BLOCK_V):
        idx = v0 + lanes
        z = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, 1.0, PENALIZE, WMAX)
        cm = tl.max(z, axis=0)
        ci = tl.min(tl.where(z == cm, idx, INT_MAX), axis=0)
        best_i = tl.where(cm > best_v, ci, best_i)
        best_v = tl.maximum(best_v, cm)
    return best_i, best_v


@triton.jit
def draft_sample(logits, lane_slot, pos, vocab_map, seed, temperature, top_p, top_k, min_p,
                 drafts, q, B, VD, V, DMAX, STEP, BLOCK_V: tl.constexpr):
    """Draft STEP of each live lane over the draft vocabulary; grid ``(B,)``."""
    b = tl.program_id(0)
    if tl.load(lane_slot + b) >= 0:
        lrow = logits + b.to(tl.int64) * VD
        ids = tl.full((8,), -1, tl.int32)
        tok, best_v = _argmax(lrow, lrow, lrow, VD, 0, 1.0, 0.0, 0.0, ids, False, 8, BLOCK_V)
        temp = tl.load(temperature + b)
        qrow = q + (b.to(tl.int64) * DMAX + STEP - 1) * V
        if (temp > 0.0) & (best_v > float("-inf")):
            zmax = tl.math.div_rn(best_v, temp)
            kkey, kcut, S, pkey, pcut, pmin, S_keep = _thresholds(
                lrow, lrow, lrow, VD, 0, 1.0, 0.0, 0.0, ids, temp, zmax, tl.load(top_k + b),
                tl.load(top_p + b), tl.load(min_p + b), False, 8, BLOCK_V)
            p0 = tl.load(pos + b)
            k0 = tl.load(seed + 2 * b)
            k1 = tl.load(seed + 2 * b + 1)
            lanes = tl.arange(0, BLOCK_V)
            best_race = tl.sum(tl.zeros((BLOCK_V,), tl.float64), axis=0) + float("-inf")
            for v0 in range(0, V, BLOCK_V):  # q is dense over target ids: clear it first
                tl.store(qrow + v0 + lanes, tl.zeros((BLOCK_V,), tl.float32),
                         mask=v0 + lanes < V)
            tl.debug_barrier()
            for v0 in range(0, VD, BLOCK_V):
                idx = v0 + lanes
                zt = _z(lrow, lrow, lrow, idx, VD, 0, 1.0, 0.0, 0.0, ids, temp, False, 8)
                p, keep = _kept(zt, idx, VD, zmax, S, kkey, kcut, pkey, pcut, pmin)
                target = tl.load(vocab_map + idx, mask=idx < VD, other=0)
                u = _philox(target, p0, p0 * 0 + 1, k0, k1)  # stream 1: drafts
                race = libdevice.log(p.to(tl.float64)) - libdevice.log(-libdevice.log(u))
                race = tl.where(keep, race, float("-inf"))
                cm = tl.max(race, axis=0)
                ci = tl.min(tl.where(keep & (race == cm), idx, INT_MAX), axis=0)
                tok = tl.where(cm > best_race, ci, tok)
                best_race = tl.maximum(best_race, cm)
                tl.store(qrow + target, tl.math.div_rn(p, S_keep + tl.zeros_like(p)), mask=keep)
        tl.store(drafts + b * DMAX + STEP - 1, tl.load(vocab_map + tok))


@triton.jit
def spec_verify(logits, slot, generation, lane_start, query_length, sampling_decision, seed,
                temperature, top_p, top_k, min_p, presence, frequency, repetition, histogram,
                grammar_mask, use_mask, drafts, q, vocab_map, token_row, pending, commit_row,
                record, B, P, V, VD, W32, DMAX, W, LAG, BLOCK_V: tl.constexpr,
                WMAX: tl.constexpr):
    """Accept drafts, emit the correction or bonus token, count, commit; grid ``(B,)``.

    The lane's packed offset is the sum of the earlier lanes' lengths (B <= 1024)."""
    b = tl.program_id(0)
    rec = record + b * (RECORD_FIELDS + W)
    for c in range(0, RECORD_FIELDS + W):
        tl.store(rec + c, -1)
    lanes_b = tl.arange(0, 1024)
    qlens = tl.load(query_length + lanes_b, mask=lanes_b < B, other=0)
    off = tl.sum(tl.where(lanes_b < b, tl.maximum(qlens, 0), 0), axis=0)
    s = tl.load(slot + b)
    n = tl.load(query_length + b)
    wl = tl.arange(0, WMAX)
    if b == B - 1:  # rows past every lane are padding: the commit pass skips them
        total = tl.sum(tl.maximum(qlens, 0), axis=0)
        for t in range(total, P):
            tl.store(commit_row + t, -1)
    if (s >= 0) & (n >= 1):
        hrow = histogram + s.to(tl.int64) * V
        mrow = grammar_mask + b.to(tl.int64) * W32
        rep = tl.load(repetition + b)
        freq = tl.load(frequency + b)
        pres = tl.load(presence + b)
        temp = tl.load(temperature + b)
        start = tl.load(lane_start + b)
        k0 = tl.load(seed + 2 * b)
        k1 = tl.load(seed + 2 * b + 1)
        lanes = tl.arange(0, BLOCK_V)
        out_ids = tl.full((WMAX,), -1, tl.int32)
        accepted = tl.min(tl.zeros_like(wl), axis=0)
        done = accepted != 0
        for j in range(0, W):
            if (j < n) & (~done):
                lrow = logits + (off + j).to(tl.int64) * V
                um = tl.where(j == 0, tl.load(use_mask + b), 0)
                best, best_v = _argmax(lrow, hrow, mrow, V, um, rep, freq, pres, out_ids, True,
                                       WMAX, BLOCK_V)
                position = start + j
                tok = best
                ok = best < 0  # False, as a tensor
                d = tl.load(drafts + b * DMAX + j, mask=j < n - 1, other=-1)
                if (temp > 0.0) & (best_v > float("-inf")):
                    zmax = tl.math.div_rn(best_v, temp)
                    kkey, kcut, S, pkey, pcut, pmin, S_keep = _thresholds(
                        lrow, hrow, mrow, V, um, rep, freq, pres, out_ids, temp, zmax,
                        tl.load(top_k + b), tl.load(top_p + b), tl.load(min_p + b), True, WMAX,
                        BLOCK_V)
                    qrow = q + (b.to(tl.int64) * DMAX + j) * V
                    stream = tl.where(j < n - 1, 3, 0)
                    # A draft outside [0, V) (cut by spec_candidate_masks) is never
                    # accepted and proposed nothing: its rejection draws from p.
                    dv = (d >= 0) & (d < V)
                    dc = tl.where(dv, d, 0)
                    if j < n - 1:  # p(d) and q(d) of the draft under test
                        zd = _z(lrow, hrow, mrow, dc + wl * 0, V, um, rep, freq, pres, out_ids,
                                temp, True, WMAX)
                        pd, kd = _kept(zd, dc + wl * 0, V, zmax, S, kkey, kcut, pkey, pcut, pmin)
                        p_d = tl.max(tl.where(kd, tl.math.div_rn(pd, S_keep + tl.zeros_like(pd)),
                                              0.0), axis=0)
                        q_d = tl.load(qrow + dc, mask=dv, other=0.0)
                        u = tl.max(_philox(wl * 0, position + wl * 0, 2 + wl * 0, k0, k1),
                                   axis=0)
                        ok = dv & (q_d > 0.0) & (u * q_d.to(tl.float64) < p_d.to(tl.float64))
                    if not ok:  # residual max(p - q, 0) on rejection; p itself for the bonus
                        best_race = tl.sum(tl.zeros((BLOCK_V,), tl.float64), axis=0) - float("inf")
                        tok = best
                        for v0 in range(0, V, BLOCK_V):
                            idx = v0 + lanes
                            zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp,
                                    True, WMAX)
                            p, keep = _kept(zt, idx, V, zmax, S, kkey, kcut, pkey, pcut, pmin)
                            weight = p
                            if j < n - 1:
                                qi = tl.load(qrow + idx, mask=(idx < V) & dv, other=0.0)
                                pn = tl.math.div_rn(p, S_keep + tl.zeros_like(p))
                                weight = tl.maximum(pn - qi, 0.0)
                                keep = keep & (weight > 0.0)
                            u = _philox(idx, position, stream, k0, k1)
                            race = libdevice.log(weight.to(tl.float64)) - \
                                libdevice.log(-libdevice.log(u))
                            race = tl.where(keep, race, float("-inf"))
                            cm = tl.max(race, axis=0)
                            ci = tl.min(tl.where(keep & (race == cm), idx, INT_MAX), axis=0)
                            tok = tl.where(cm > best_race, ci, tok)
                            best_race = tl.maximum(best_race, cm)
                else:
                    ok = (j < n - 1) & (d == best)
                if ok:
                    tok = d
                    accepted += 1
                out_ids = tl.where(wl == j, tok, out_ids)
                tl.store(rec + RECORD_FIELDS + j, tok)
                done = done | (~ok)
        emitted = accepted + 1
        for j in range(0, W):  # the head's entries to rewrite: pending + accepted positions
            tl.store(commit_row + off + j, tl.where(j <= accepted, b, -1), mask=j < n)
        last = tl.max(tl.where(wl == accepted, out_ids, -1), axis=0)
        tl.store(pending + s, last)
        if tl.load(sampling_decision + b) != 0:
            tl.atomic_add(hrow + out_ids, 1, mask=wl < emitted)
        cursor = tl.where(LAG >= 0, tl.maximum(start + emitted - LAG, 0), -1)
        tl.store(rec + 0, tl.load(generation + b))
        tl.store(rec + 1, n)
        tl.store(rec + 2, accepted)
        tl.store(rec + 3, emitted)
        tl.store(rec + 4, cursor)


@triton.jit
def draft_sample_coupled(logits, lane_slot, pos, vocab_map, seed, temperature, top_p, top_k,
                         min_p, drafts, B, VD, DMAX, STEP, BLOCK_V: tl.constexpr):
    """Draft STEP of each live lane: the race over the head's distribution with the
    target's stream-0 noise at the same position and target ids; grid ``(B,)``."""
    b = tl.program_id(0)
    if tl.load(lane_slot + b) >= 0:
        lrow = logits + b.to(tl.int64) * VD
        ids = tl.full((8,), -1, tl.int32)
        tok, best_v = _argmax(lrow, lrow, lrow, VD, 0, 1.0, 0.0, 0.0, ids, False, 8, BLOCK_V)
        temp = tl.load(temperature + b)
        if (temp > 0.0) & (best_v > float("-inf")):
            zmax = tl.math.div_rn(best_v, temp)
            kkey, kcut, S, pkey, pcut, pmin, S_keep = _thresholds(
                lrow, lrow, lrow, VD, 0, 1.0, 0.0, 0.0, ids, temp, zmax, tl.load(top_k + b),
                tl.load(top_p + b), tl.load(min_p + b), False, 8, BLOCK_V)
            p0 = tl.load(pos + b)
            k0 = tl.load(seed + 2 * b)
            k1 = tl.load(seed + 2 * b + 1)
            lanes = tl.arange(0, BLOCK_V)
            best_race = tl.sum(tl.zeros((BLOCK_V,), tl.float64), axis=0) + float("-inf")
            for v0 in range(0, VD, BLOCK_V):
                idx = v0 + lanes
                zt = _z(lrow, lrow, lrow, idx, VD, 0, 1.0, 0.0, 0.0, ids, temp, False, 8)
                p, keep = _kept(zt, idx, VD, zmax, S, kkey, kcut, pkey, pcut, pmin)
                target = tl.load(vocab_map + idx, mask=idx < VD, other=0)
                race = tl.where(keep, _race_score(p, target, p0, k0, k1), float("-inf"))
                cm = tl.max(race, axis=0)
                ci = tl.min(tl.where(keep & (race == cm), idx, INT_MAX), axis=0)
                tok = tl.where(cm > best_race, ci, tok)
                best_race = tl.maximum(best_race, cm)
        tl.store(drafts + b * DMAX + STEP - 1, tl.load(vocab_map + tok))


@triton.jit
def spec_verify_coupled(logits, slot, generation, lane_start, query_length, sampling_decision,
                        seed, temperature, top_p, top_k, min_p, presence, frequency,
                        repetition, histogram, grammar_mask, use_mask, drafts, token_row,
                        pending, commit_row, record, B, P, V, W32, DMAX, W, LAG,
                        BLOCK_V: tl.constexpr, WMAX: tl.constexpr):
    """Emit the target's own draw at every row (argmax, or the sampler's race on stream
    0), accept the drafts equal to it, count, commit; grid ``(B,)``.

    The lane's packed offset is the sum of the earlier lanes' lengths (B <= 1024)."""
    b = tl.program_id(0)
    rec = record + b * (RECORD_FIELDS + W)
    for c in tl.static_range(RECORD_FIELDS):
        tl.store(rec + c, -1)
    for c in range(0, W):
        tl.store(rec + RECORD_FIELDS + c, -1)
    lanes_b = tl.arange(0, 1024)
    qlens = tl.load(query_length + lanes_b, mask=lanes_b < B, other=0)
    off = tl.sum(tl.where(lanes_b < b, tl.maximum(qlens, 0), 0), axis=0)
    s = tl.load(slot + b)
    n = tl.load(query_length + b)
    wl = tl.arange(0, WMAX)
    if b == B - 1:  # rows past every lane are padding: the commit pass skips them
        total = tl.sum(tl.maximum(qlens, 0), axis=0)
        for t in range(total, P):
            tl.store(commit_row + t, -1)
    if (s >= 0) & (n >= 1):
        hrow = histogram + s.to(tl.int64) * V
        mrow = grammar_mask + b.to(tl.int64) * W32
        rep = tl.load(repetition + b)
        freq = tl.load(frequency + b)
        pres = tl.load(presence + b)
        temp = tl.load(temperature + b)
        start = tl.load(lane_start + b)
        k0 = tl.load(seed + 2 * b)
        k1 = tl.load(seed + 2 * b + 1)
        lanes = tl.arange(0, BLOCK_V)
        out_ids = tl.full((WMAX,), -1, tl.int32)
        accepted = tl.min(tl.zeros_like(wl), axis=0)
        done = accepted != 0
        for j in range(0, W):
            if (j < n) & (~done):
                lrow = logits + (off + j).to(tl.int64) * V
                um = tl.where(j == 0, tl.load(use_mask + b), 0)
                best, best_v = _argmax(lrow, hrow, mrow, V, um, rep, freq, pres, out_ids, True,
                                       WMAX, BLOCK_V)
                position = start + j
                tok = best
                if (temp > 0.0) & (best_v > float("-inf")):  # the decode sampler's race
                    zmax = tl.math.div_rn(best_v, temp)
                    kkey, kcut, S, pkey, pcut, pmin, S_keep = _thresholds(
                        lrow, hrow, mrow, V, um, rep, freq, pres, out_ids, temp, zmax,
                        tl.load(top_k + b), tl.load(top_p + b), tl.load(min_p + b), True, WMAX,
                        BLOCK_V)
                    best_race = tl.sum(tl.zeros((BLOCK_V,), tl.float64), axis=0) - float("inf")
                    for v0 in range(0, V, BLOCK_V):
                        idx = v0 + lanes
                        zt = _z(lrow, hrow, mrow, idx, V, um, rep, freq, pres, out_ids, temp,
                                True, WMAX)
                        p, keep = _kept(zt, idx, V, zmax, S, kkey, kcut, pkey, pcut, pmin)
                        race = tl.where(keep, _race_score(p, idx, position, k0, k1),
                                        float("-inf"))
                        cm = tl.max(race, axis=0)
                        ci = tl.min(tl.where(keep & (race == cm), idx, INT_MAX), axis=0)
                        tok = tl.where(cm > best_race, ci, tok)
                        best_race = tl.maximum(best_race, cm)
                d = tl.load(drafts + b * DMAX + j, mask=j < n - 1, other=-1)
                ok = (j < n - 1) & (d == tok)
                if ok:
                    accepted += 1
                out_ids = tl.where(wl == j, tok, out_ids)
                tl.store(rec + RECORD_FIELDS + j, tok)
                done = done | (~ok)
        emitted = accepted + 1
        for j in range(0, W):  # the head's entries to rewrite: pending + accepted positions
            tl.store(commit_row + off + j, tl.where(j <= accepted, b, -1), mask=j < n)
        last = tl.max(tl.where(wl == accepted, out_ids, -1), axis=0)
        tl.store(pending + s, last)
        if tl.load(sampling_decision + b) != 0:
            tl.atomic_add(hrow + out_ids, 1, mask=wl < emitted)
        cursor = tl.where(LAG >= 0, tl.maximum(start + emitted - LAG, 0), -1)
        tl.store(rec + 0, tl.load(generation + b))
        tl.store(rec + 1, n)
        tl.store(rec + 2, accepted)
        tl.store(rec + 3, emitted)
        tl.store(rec + 4, cursor)


@triton.jit
def spec_copy_drafts(cand_ids, cand_count, cand_generation, cand_endpoint, generation,
                     lane_start, query_length, lane_slot, drafts, B, CMAX, DMAX, V, STEP,
                     BLOCK: tl.constexpr):
    """Copied candidate STEP replaces the head's draft of a live lane with fresh
    candidates (no q: coupled programs); grid ``(cdiv(B, BLOCK),)``."""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = b < B
    fresh = (tl.load(cand_generation + b, mask=inb, other=0) ==
             tl.load(generation + b, mask=inb, other=0)) & \
        (tl.load(cand_endpoint + b, mask=inb, other=0) ==
         tl.load(lane_start + b, mask=inb, other=0))
    cap = tl.minimum(tl.minimum(CMAX, DMAX),
                     tl.maximum(tl.load(query_length + b, mask=inb, other=0) - 1, 0))
    k = tl.where(fresh, tl.minimum(tl.maximum(tl.load(cand_count + b, mask=inb, other=0), 0),
                                   cap), 0)
    d = tl.load(cand_ids + b * CMAX + STEP - 1, mask=inb & (STEP <= CMAX), other=-1)
    take = inb & (tl.load(lane_slot + b, mask=inb, other=-1) >= 0) & (STEP <= k) & (d >= 0) & \
        (d < V)
    tl.store(drafts + b * DMAX + STEP - 1, d, mask=take)


@triton.jit
def spec_copy_candidates(cand_ids, cand_count, cand_generation, cand_endpoint, generation,
                         lane_start, query_length, lane_slot, drafts, q, B, CMAX, DMAX, V, STEP,
                         BLOCK_V: tl.constexpr):
    """Copied candidate STEP replaces the head's draft of a live lane with fresh candidates;
    grid ``(B,)``."""
    b = tl.program_id(0)
    fresh = (tl.load(cand_generation + b) == tl.load(generation + b)) & \
        (tl.load(cand_endpoint + b) == tl.load(lane_start + b))
    cap = tl.minimum(tl.minimum(CMAX, DMAX), tl.maximum(tl.load(query_length + b) - 1, 0))
    k = tl.where(fresh, tl.minimum(tl.maximum(tl.load(cand_count + b), 0), cap), 0)
    d = tl.load(cand_ids + b * CMAX + STEP - 1, mask=STEP <= CMAX, other=-1)
    if (tl.load(lane_slot + b) >= 0) & (STEP <= k) & (d >= 0) & (d < V):
        tl.store(drafts + b * DMAX + STEP - 1, d)
        qrow = q + (b.to(tl.int64) * DMAX + STEP - 1) * V
        lanes = tl.arange(0, BLOCK_V)
        for v0 in range(0, V, BLOCK_V):
            idx = v0 + lanes
            tl.store(qrow + idx, tl.where(idx == d, 1.0, 0.0).to(tl.float32), mask=idx < V)


@triton.jit
def spec_candidate_masks(logits, token_row, positions, slot, lane_start, query_length, use_mask,
                         cand_masks, cand_count, cand_generation, cand_endpoint, generation,
                         drafts, P, B, V, W32, CMAX, DMAX, BLOCK_V: tl.constexpr):
    """A constrained lane's row j in 1..k takes candidate mask j - 1; its drafts past the
    copied run become -1; grid ``(P,)``, one program per packed row."""
    t = tl.program_id(0)
    b = tl.load(token_row + t)
    bc = tl.maximum(b, 0)
    s = tl.load(slot + bc)
    if (b >= 0) & (s >= 0) & (tl.load(use_mask + bc) != 0):
        start = tl.load(lane_start + bc)
        n = tl.load(query_length + bc)
        fresh = (tl.load(cand_generation + bc) == tl.load(generation + bc)) & \
            (tl.load(cand_endpoint + bc) == start)
        cap = tl.minimum(tl.minimum(CMAX, DMAX), tl.maximum(n - 1, 0))
        k = tl.where(fresh, tl.minimum(tl.maximum(tl.load(cand_count + bc), 0), cap), 0)
        j = tl.load(positions + t) - start
        if (j >= 1) & (j <= k):
            lrow = logits + t.to(tl.int64) * V
            mrow = cand_masks + (s.to(tl.int64) * CMAX + (j - 1)) * W32  # slot s's masks
            lanes = tl.arange(0, BLOCK_V)
            for v0 in range(0, V, BLOCK_V):
                idx = v0 + lanes
                w = tl.load(mrow + idx // 32, mask=idx < V, other=0)
                blocked = (idx < V) & (((w >> (idx % 32)) & 1) == 0)
                tl.store(lrow + idx, float("-inf"), mask=blocked)
        if (j >= k) & (j < tl.minimum(n - 1, DMAX)):
            tl.store(drafts + bc * DMAX + j, -1)


@triton.jit
def spec_confidence(logits, lane_slot, drafts, vocab_map, confidence, B, VD, DMAX, STEP,
                    BLOCK_V: tl.constexpr):
    """The head's softmax probability of draft STEP (0 outside the draft vocabulary);
    grid ``(B,)``."""
    b = tl.program_id(0)
    if tl.load(lane_slot + b) >= 0:
        lrow = logits + b.to(tl.int64) * VD
        d = tl.load(drafts + b * DMAX + STEP - 1)
        lanes = tl.arange(0, BLOCK_V)
        m = tl.full((BLOCK_V,), float("-inf"), tl.float32)
        hit = tl.full((BLOCK_V,), INT_MAX, tl.int32)
        for v0 in range(0, VD, BLOCK_V):
            idx = v0 + lanes
            z = tl.load(lrow + idx, mask=idx < VD, other=float("-inf"))
            m = tl.maximum(m, z)
            target = tl.load(vocab_map + idx, mask=idx < VD, other=-1)
            hit = tl.minimum(hit, tl.where((target == d) & (idx < VD), idx, INT_MAX))
        zmax = tl.max(m, axis=0)
        k = tl.min(hit, axis=0)
        total = tl.zeros((BLOCK_V,), tl.float32)
        for v0 in range(0, VD, BLOCK_V):
            idx = v0 + lanes
            z = tl.load(lrow + idx, mask=idx < VD, other=float("-inf"))
            total += tl.where(idx < VD, tl.exp(z - zmax), 0.0)
        zk = tl.load(lrow + k, mask=k < VD, other=float("-inf"))
        conf = tl.where(k < VD, tl.exp(zk - zmax) / tl.sum(total, axis=0), 0.0)
        tl.store(confidence + b * DMAX + STEP - 1, conf)


@triton.jit
def spec_allocate(ceiling, slot, confidence, query_length, B, P, DMAX, BLOCK_B: tl.constexpr):
    """Causal-prefix allocation of the P rows (highest FP64 survival first; ties: shorter
    prefix, lower slot, lower lane); grid ``(1,)``, every lane in one block."""
    b = tl.arange(0, BLOCK_B)
    inb = b < B
    s = tl.load(slot + b, mask=inb, other=-1)
    ceil = tl.load(ceiling + b, mask=inb, other=0)
    n = tl.where(inb & (s >= 0) & (ceil >= 1), 1, 0)
    limit = tl.minimum(ceil, DMAX + 1)
    survival = tl.full((BLOCK_B,), 1.0, tl.float64)
    rows_left = P - tl.sum(n, axis=0)
    for it in range(0, P):
        open_ = (n >= 1) & (n < limit)
        c = tl.load(confidence + b * DMAX + (n - 1), mask=open_, other=0.0).to(tl.float64)
        c = tl.where(c == c, tl.maximum(c, 0.0), 0.0)  # NaN and negatives count as 0
        v = tl.where(open_, survival * c, -1.0)
        best = tl.max(v, axis=0)
        key = (n.to(tl.int64) << 42) | ((s.to(tl.int64) & 0x1FFFFF) << 21) | b.to(tl.int64)
        kmin = tl.min(tl.where(open_ & (v == best), key, 0x7FFFFFFFFFFFFFFF), axis=0)
        take = (it < rows_left) & (best >= 0.0) & open_ & (key == kmin)
        survival = tl.where(take, v, survival)
        n = tl.where(take, n + 1, n)
    tl.store(query_length + b, n, mask=inb)


@triton.jit
def spec_pack_rows(query_length, lane_start, slot, positions, token_row, token_slot, B, P,
                   BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr):
    """Rows of the allocated lanes in lane order, padding past them; grid
    ``(cdiv(P, BLOCK_T),)``, every lane in one block."""
    lane = tl.arange(0, BLOCK_B)
    n = tl.maximum(tl.load(query_length + lane, mask=lane < B, other=0), 0)
    end = tl.cumsum(n, axis=0)  # inclusive: lane l's rows are [end - n, end)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    # lane of row t = how many lanes end at or before t
    row = tl.sum((end[None, :] <= t[:, None]).to(tl.int32), axis=1)
    real = (t < tl.sum(n, axis=0)) & (t < P)
    first = tl.sum(tl.where(lane[None, :] == row[:, None], (end - n)[None, :], 0), axis=1)
    start = tl.load(lane_start + row, mask=real, other=0)
    s = tl.load(slot + row, mask=real, other=-1)
    tl.store(positions + t, tl.where(real, start + t - first, 0), mask=t < P)
    tl.store(token_row + t, tl.where(real, row, -1), mask=t < P)
    tl.store(token_slot + t, tl.where(real, s, -1), mask=t < P)
