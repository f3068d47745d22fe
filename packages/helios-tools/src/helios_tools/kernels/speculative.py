"""Speculative generation: draft steps, verification of W positions per lane, commit.

Specification: "Complete speculative generation". One SPECULATIVE program per
(B, D, W, P) runs, for B lanes with host-selected lengths n_b <= min(D + 1, W)
(QUERY_LENGTH) whose sum fits P:

1. D draft steps of the learned head (helios_ignition/checkpoint/drafter.py): step k
   reads, per lane, the entry at position c + k - 1 (c = lane start, the pending
   token's position) and proposes the token at c + k (`spec_draft_inputs`, the head's
   layer, `draft_sample_coupled`). Lanes with n_b <= k skip step k >= 2 (their rows are padding).
2. Target verification: the lane's n_b positions c .. c + n_b - 1 are packed target rows
   (`spec_pack_tokens`: pending token, then drafts), run through the decode-row forward
   (one query row per position attending to its lane's cache, which holds the window's
   own keys: causal within the lane), then `spec_verify_coupled` accepts drafts and emits the
   correction or bonus token.
3. Commit (the verify op's commit rows): the head's entries of the accepted positions
   are rewritten from true target features; the pending token becomes the last
   emitted one; the histogram counts every emitted token.

Sampling: coupled (drafter-invariant) verification (Daliri, Musco, Suresh 2025,
"Coupling without Communication and Drafter-Invariant Speculative Decoding", arXiv
2408.07978; the Gumbel-max trick). The token at every output position is the target
sampler's own draw for that (seed, position): the exponential race of
helios_tools.kernels.sampling (``_race``: ``argmax log p_i - log(-log u_i)`` over
Philox(seed, position, id, stream 0)), exactly what the decode program draws there.
`spec_verify_coupled` accepts a draft iff it equals that draw and emits the draw at the
first mismatch (correction) or after the last draft (bonus); no residual, no acceptance
uniform. So seeded text is the decode program's text whatever the lane lengths (widths,
width policy, batch, output limit, preemption), and its distribution is p by
construction. The head proposes with the same noise (`draft_sample_coupled`: the race
over q, its distribution after temperature and the truncations, with the target's
stream-0 uniforms of the same position and target ids), so a draft matches whenever
the two races agree: probability sum_i p_i q_i / sum_j max(p_j q_i, q_j p_i) >=
(1 - TV) / (1 + TV) (Daliri et al.), against 1 - TV for standard speculative sampling;
a deterministic draft d (greedy head, copied candidate) matches with probability p(d),
as in standard speculative sampling. Greedy rows (temperature <= 0) accept a draft iff
it equals the argmax, so they emit the decode program's tokens whenever the verify
rows' logits equal the decode rows' (row-invariant kernels).
p is the target row after the sampler's processing (penalties over the lane's
histogram including the drafts accepted so far, grammar mask at the lane's first row,
temperature, top-k, top-p, min-p); q the head's after temperature, top-k, top-p and
min-p (no penalties or mask) over the draft vocabulary.

RNG reservations (Philox4x32-10, key = request seed, counter = (index, position,
stream, 0)), so a seeded request draws the same numbers alone or in any batch:
coupled programs draw stream 0 only -- the target's race at row j (position c + j)
and the head's proposal for the token verified there (draft step j + 1 reads the
entry at c + j): one stream for both, which is the coupling. Streams 1-3 stay
reserved for the ops of cores exported before coupled verification, which still load
and run unchanged (`draft_sample`, `spec_verify`, `spec_copy_candidates`: standard
speculative sampling, Leviathan et al. 2023; Chen et al. 2023): stream 1 = draft
proposals (position c + k - 1), 2 = the acceptance uniform of row j (index 0,
position c + j), 3 = the residual draw norm(max(p - q, 0)) of row j. Allocation draws
nothing.

Completion record (int32 ``[B, RECORD_FIELDS + W]`` per lane): generation, offers
(target positions verified, n_b), accepted drafts a_b, emitted tokens a_b + 1, draft
cursor (c + a_b + 1 - lag: the head's entries below it are committed; -1 for a graph
without one), the reserved model field -1, then the emitted ids (-1 past them).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .rng import philox_uniform
from .sampling import _allowed, _candidates, _penalize, _race

STREAM_TARGET, STREAM_DRAFT, STREAM_ACCEPT, STREAM_RESIDUAL = 0, 1, 2, 3
RECORD_FIELDS = 6
(FIELD_GENERATION, FIELD_OFFERS, FIELD_ACCEPTED, FIELD_EMITTED, FIELD_DRAFT_CURSOR,
 FIELD_RESERVED) = range(RECORD_FIELDS)


def _lane_offsets(query_length: NDArray[np.int32], B: int) -> NDArray[np.int64]:
    """Packed-row offset of each lane: the sum of the earlier lanes' lengths."""
    n = np.maximum(query_length[:B].astype(np.int64), 0)
    return np.concatenate([[0], np.cumsum(n)[:-1]]) if B else n


def spec_draft_inputs(
    pending: NDArray[np.int32],
    slot: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    query_length: NDArray[np.int32],
    drafts: NDArray[np.int32],
    tok: NDArray[np.int32],
    pos: NDArray[np.int32],
    row: NDArray[np.int32],
    lane_slot: NDArray[np.int32],
    B: int,
    S: int,
    DMAX: int,
    STEP: int,
) -> None:
    """Inputs of draft step STEP (1-based) for every lane.

    Reference loop::

        for b in range(B):
            live = slot[b] >= 0 and (STEP == 1 or query_length[b] > STEP)
            if not live:
                tok[b] = -1; pos[b] = 0; row[b] = -1; lane_slot[b] = -1; continue
            tok[b] = pending[slot[b]] if STEP == 1 else drafts[b, STEP - 2]
            pos[b] = lane_start[b] + STEP - 1      # the entry this step writes and reads
            row[b] = b; lane_slot[b] = slot[b]

    Step 1 runs for every live lane, even one of length 1: it writes the head's entry of
    the pending token, which later rounds attend to (the draft context).

    Args:
        pending: ``[S]`` i32 pending token per physical request row.
        slot: ``[B]`` i32 physical request rows, < 0 for padding.
        lane_start: ``[B]`` i32 position of each lane's pending token.
        query_length: ``[B]`` i32 lane lengths n_b (target positions incl. pending).
        drafts: ``[B, DMAX]`` i32 target ids drafted so far.
        tok, pos, row, lane_slot: ``[B]`` i32, written.
        B: lanes. S: physical request rows. DMAX: draft columns. STEP: 1..D.
    """
    s = slot[:B].astype(np.int64)
    n = query_length[:B]
    live = (s >= 0) & (s < S) & ((STEP == 1) | (n > STEP))
    if STEP == 1:
        src = np.where(live, pending[np.where(live, s, 0)], -1)
    else:
        src = np.where(live, drafts[:B, STEP - 2], -1)
    tok[:B] = src
    pos[:B] = np.where(live, lane_start[:B] + STEP - 1, 0)
    row[:B] = np.where(live, np.arange(B), -1)
    lane_slot[:B] = np.where(live, s, -1)


def draft_sample(
    logits: NDArray[np.float32],
    lane_slot: NDArray[np.int32],
    pos: NDArray[np.int32],
    vocab_map: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    min_p: NDArray[np.float32],
    drafts: NDArray[np.int32],
    q: NDArray[np.float32],
    B: int,
    VD: int,
    V: int,
    DMAX: int,
    STEP: int,
) -> None:
    """Draw draft STEP of every live lane from the head's logits over the draft vocabulary
    on its own stream, recording q (standard speculative sampling: the op of cores
    exported before coupled verification; new cores record `draft_sample_coupled`).

    Reference loop::

        for b in range(B):
            if lane_slot[b] < 0: continue                  # lane skips this step
            z = logits[b, :VD]
            if temperature[b] <= 0:
                i = argmax(z)                               # greedy lanes keep no q
            else:
                cand, p = candidates(z, temperature[b], top_k[b], top_p[b], min_p[b])
                i = argmax over cand of log(p) - log(-log(
                        philox_u(seed[b], pos[b], vocab_map[cand], stream=1)))
                q[b, STEP - 1, :] = 0; q[b, STEP - 1, vocab_map[cand]] = p   # target ids
            drafts[b, STEP - 1] = vocab_map[i]

    ``candidates`` is the sampler's truncation (helios_tools.kernels.sampling): ids kept by
    top-k, top-p and min-p with their renormalized f32 probabilities.

    Args:
        logits: ``[B, VD]`` f32 head logits (row b = lane b).
        lane_slot: ``[B]`` i32 from ``spec_draft_inputs`` (< 0: skip).
        pos: ``[B]`` i32 position of the entry read (RNG counter word 1).
        vocab_map: ``[VD]`` i32 target id of each draft id.
        seed, temperature, top_p, top_k, min_p: ``[B]`` per-lane sampling inputs.
        drafts: ``[B, DMAX]`` i32, column STEP - 1 written for live lanes.
        q: ``[B, DMAX, V]`` f32 draft probabilities over target ids, row (b, STEP - 1)
            written for sampled live lanes (zero outside the kept draft ids).
        B: lanes. VD: draft vocabulary. V: target vocabulary (q's rows). DMAX: draft
        columns. STEP: 1..D.
    """
    for b in range(B):
        if lane_slot[b] < 0:
            continue
        z = logits[b, :VD].astype(np.float32, copy=False)
        if temperature[b] <= 0.0:
            i = int(np.argmax(z))
        else:
            cand, p = _sampled(z, float(temperature[b]), int(top_k[b]), float(top_p[b]),
                               float(min_p[b]))
            q[b, STEP - 1, :V] = 0.0
            q[b, STEP - 1, vocab_map[cand]] = p
            drafts[b, STEP - 1] = _race(vocab_map[cand].astype(np.int64), p,
                                        int(seed[b, 0]), int(seed[b, 1]), int(pos[b]),
                                        STREAM_DRAFT)
            continue
        drafts[b, STEP - 1] = vocab_map[i]


def draft_sample_coupled(
    logits: NDArray[np.float32],
    lane_slot: NDArray[np.int32],
    pos: NDArray[np.int32],
    vocab_map: NDArray[np.int32],
    seed: NDArray[np.uint32],
    temperature: NDArray[np.float32],
    top_p: NDArray[np.float32],
    top_k: NDArray[np.int32],
    min_p: NDArray[np.float32],
    drafts: NDArray[np.int32],
    B: int,
    VD: int,
    DMAX: int,
    STEP: int,
) -> None:
    """Draft STEP of every live lane, coupled with the target's draw at the position it
    proposes for (Gumbel-max coupling; Daliri et al. 2025, see module).

    Reference loop::

        for b in range(B):
            if lane_slot[b] < 0: continue                  # lane skips this step
            z = logits[b, :VD]
            if temperature[b] <= 0:
                d = vocab_map[argmax(z)]                    # first index on ties
            else:
                cand, p = candidates(z, temperature[b], top_k[b], top_p[b], min_p[b])
                d = argmax over t in vocab_map[cand] of log p - log(-log(
                        philox_u(seed[b], pos[b], t, stream=0)))     # first on ties
            drafts[b, STEP - 1] = d

    ``candidates`` is the sampler's truncation (helios_tools.kernels.sampling; f32
    probabilities as it computes them, not renormalized) and the race is the sampler's
    ``_race`` with the target's own uniforms: position ``pos[b]`` (= c + STEP - 1, the
    target row that verifies this draft) and target ids. Where q and p agree, so do
    the draws.

    Args:
        logits: ``[B, VD]`` f32 head logits (row b = lane b).
        lane_slot: ``[B]`` i32 from ``spec_draft_inputs`` (< 0: skip).
        pos: ``[B]`` i32 position of the entry read (RNG counter word 1).
        vocab_map: ``[VD]`` i32 target id of each draft id.
        seed, temperature, top_p, top_k, min_p: ``[B]`` per-lane sampling inputs.
        drafts: ``[B, DMAX]`` i32, column STEP - 1 written for live lanes.
        B: lanes. VD: draft vocabulary. DMAX: draft columns. STEP: 1..D.
    """
    for b in range(B):
        if lane_slot[b] < 0:
            continue
        z = logits[b, :VD].astype(np.float32, copy=False)
        if temperature[b] <= 0.0:
            drafts[b, STEP - 1] = vocab_map[int(np.argmax(z))]
            continue
        cand, p = _candidates(z, float(temperature[b]), int(top_k[b]), float(top_p[b]),
                              float(min_p[b]))
        drafts[b, STEP - 1] = _race(vocab_map[cand].astype(np.int64), p, int(seed[b, 0]),
                                    int(seed[b, 1]), int(pos[b]))


def spec_pack_tokens(
    pending: NDArray[np.int32],
    slot: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    drafts: NDArray[np.int32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    tokens: NDArray[np.int32],
    B: int,
    P: int,
    S: int,
    DMAX: int,
) -> None:
    """Target token of every packed verification row.

    Reference loop::

        for t in range(P):
            b = token_row[t]
            if b < 0 or slot[b] < 0: tokens[t] = -1; continue       # padding row
            j = positions[t] - lane_start[b]                        # 0 = pending token
            tokens[t] = pending[slot[b]] if j == 0 else drafts[b, j - 1]

    Args:
        pending: ``[S]`` i32. slot, lane_start: ``[B]`` i32. drafts: ``[B, DMAX]`` i32.
        positions, token_row: ``[P]`` i32 packed rows (host-packed, lane order).
        tokens: ``[P]`` i32, written.
        B: lanes. P: packed rows. S: physical request rows. DMAX: draft columns.
    """
    b = token_row[:P].astype(np.int64)
    real = b >= 0
    bb = np.where(real, b, 0)
    s = slot[:B][bb].astype(np.int64)
    real &= (s >= 0) & (s < S)
    j = positions[:P] - lane_start[:B][bb]
    drafted = drafts[bb, np.clip(j - 1, 0, max(DMAX - 1, 0))] if DMAX else np.full(P, -1)
    out = np.where(j == 0, pending[np.where(real, s, 0)], drafted)
    tokens[:P] = np.where(real, out, -1)


def _sampled(z: NDArray[np.float32], temperature: float, top_k: int, top_p: float,
             min_p: float) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """The sampler's distribution: its candidates (top-k, top-p, min-p) with their
    probabilities renormalized over the kept ids (what the race draws from)."""
    cand, p = _candidates(z, temperature, top_k, top_p, min_p)
    return cand, p / p.sum(dtype=np.float32)


def _lane_ids(cand: NDArray[np.int64], p: NDArray[np.float32], V: int) -> NDArray[np.float32]:
    dense = np.zeros(V, np.float32)
    dense[cand] = p
    return dense


def spec_verify_coupled(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    generation: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    query_length: NDArray[np.int32],
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
    grammar_mask: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    drafts: NDArray[np.int32],
    token_row: NDArray[np.int32],
    pending: NDArray[np.int32],
    commit_row: NDArray[np.int32],
    record: NDArray[np.int32],
    B: int,
    P: int,
    V: int,
    W32: int,
    DMAX: int,
    W: int,
    LAG: int,
) -> None:
    """Coupled verification: emit the target's own draw at every position, accept the
    drafts that equal it, count, commit (see module; Daliri et al. 2025).

    Reference loop (lane b, packed rows off_b .. off_b + n - 1, off_b = sum of earlier
    lengths)::

        for b in range(B):
            record[b] = (-1, ...)
            s = slot[b]; n = query_length[b]
            if s < 0 or n < 1: continue
            a, out = 0, []
            for j in range(n):
                z = processed(logits[off_b + j]) with histogram[s] (+ counts of out so far)
                    and the grammar mask when j == 0 and use_mask[b]
                tok = argmax(z) if greedy else
                      race over the sampler's candidates of z (top-k, top-p, min-p; f32
                      probabilities as sample_biased) with philox_u(seed[b],
                      lane_start[b] + j, i, stream 0)       # decode's draw, bit for bit
                out.append(tok)
                if j < n - 1 and drafts[b, j] == tok: a += 1; continue
                break                                       # correction or bonus
            for tok in out: if sampling_decision[b]: histogram[s, tok] += 1
            pending[s] = out[-1]
            record[b] = (generation[b], n, a, a + 1, max(lane_start[b] + a + 1 - LAG, 0)
                         (or -1 when LAG < 0), -1, out..., -1...)
            commit_row[off_b + j] = b for j <= a, -1 for a < j < n (and past every lane)

    A greedy row is one with temperature <= 0 or no finite logit (as ``sample_biased``).
    The emitted tokens are the decode program's for the same seed and positions
    whatever the drafts are: a draft only decides how many of them one step emits.

    Args:
        logits: ``[P, V]`` f32 target logits of the packed rows.
        slot, generation, lane_start, query_length, sampling_decision: ``[B]`` i32.
        seed: ``[B, 2]`` u32. temperature, top_p, min_p, presence, frequency, repetition:
            ``[B]`` f32. top_k, use_mask: ``[B]`` i32.
        histogram: ``[S, V]`` i32, updated. grammar_mask: ``[B, W32]`` i32.
        drafts: ``[B, DMAX]`` i32 target ids (learned or copied).
        token_row: ``[P]`` i32 lane of each packed row (< 0 padding).
        pending: ``[S]`` i32, the lane's slot entry written.
        commit_row: ``[P]`` i32, written (the head's entries to rewrite: lane or -1).
        record: ``[B, RECORD_FIELDS + W]`` i32, written.
        B: lanes. P: packed rows. V: vocabulary. W32: mask words. DMAX: draft columns.
        W: emitted-token columns. LAG: draft cursor lag, or -1 for a graph without a
        draft cursor.
    """
    _verify_lanes(logits, slot, generation, lane_start, query_length, sampling_decision,
                  seed, temperature, top_p, top_k, min_p, presence, frequency, repetition,
                  histogram, grammar_mask, use_mask, drafts, None, pending, commit_row,
                  record, B, P, V, W32, W, LAG)


def spec_verify(
    logits: NDArray[np.float32],
    slot: NDArray[np.int32],
    generation: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    query_length: NDArray[np.int32],
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
    grammar_mask: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    drafts: NDArray[np.int32],
    q: NDArray[np.float32],
    vocab_map: NDArray[np.int32],
    token_row: NDArray[np.int32],
    pending: NDArray[np.int32],
    commit_row: NDArray[np.int32],
    record: NDArray[np.int32],
    B: int,
    P: int,
    V: int,
    VD: int,
    W32: int,
    DMAX: int,
    W: int,
    LAG: int,
) -> None:
    """Standard speculative sampling, the verify op of cores exported before coupled
    verification (kept so they keep loading; new cores record `spec_verify_coupled`).

    As `spec_verify_coupled`, except at a sampled row j < n - 1: the draft d (~ q) is
    accepted iff ``u(seed, lane_start + j, index 0, stream 2) * q[b, j, d] < p[d]`` (p
    renormalized over the kept ids), else the token is the race over norm(max(p -
    q[b, j], 0)) on stream 3 (p itself when that is all zero); the last row draws from
    p on stream 0 (Leviathan et al. 2023, "Fast Inference from Transformers via
    Speculative Decoding"; Chen et al. 2023). Emitted tokens are distributed as p, but
    the token at a position depends on whether the lane drafted it.

    Args: as `spec_verify_coupled`, plus q ``[B, DMAX, V]`` f32 draft probabilities over
    target ids (sampled lanes), vocab_map ``[VD]`` i32 and VD (the draft vocabulary).
    A draft outside [0, V) (cut by `spec_candidate_masks`) is never accepted; its row
    draws from p.
    """
    _verify_lanes(logits, slot, generation, lane_start, query_length, sampling_decision,
                  seed, temperature, top_p, top_k, min_p, presence, frequency, repetition,
                  histogram, grammar_mask, use_mask, drafts, q, pending, commit_row, record,
                  B, P, V, W32, W, LAG)


def _verify_lanes(logits, slot, generation, lane_start, query_length, sampling_decision,
                  seed, temperature, top_p, top_k, min_p, presence, frequency, repetition,
                  histogram, grammar_mask, use_mask, drafts, q, pending, commit_row, record,
                  B, P, V, W32, W, LAG) -> None:
    """The lane walk of both verify ops: `q` None = coupled, else standard sampling."""
    rec = record[:B, : RECORD_FIELDS + W]
    rec[...] = -1
    commit_row[:P] = -1
    offsets = _lane_offsets(query_length, B)
    for b in range(B):
        s, n = int(slot[b]), int(query_length[b])
        if s < 0 or n < 1:
            continue
        off = int(offsets[b])
        start = int(lane_start[b])
        seed_lo, seed_hi = int(seed[b, 0]), int(seed[b, 1])
        temp = float(temperature[b])
        counts = histogram[s, :V].copy()
        out: list[int] = []
        accepted = 0
        for j in range(n):
            z = _penalize(logits[off + j, :V].astype(np.float32, copy=False), counts,
                          float(presence[b]), float(frequency[b]), float(repetition[b]))
            if j == 0 and use_mask[b]:
                z = np.where(_allowed(grammar_mask[b, :W32], V), z, np.float32(-np.inf))
            best = int(np.argmax(z))
            position = start + j
            drafted = j < n - 1
            d = int(drafts[b, j]) if drafted else -1
            standard = False  # a sampled draft of a core exported before coupling
            tok = best
            if temp > 0.0 and np.isfinite(z[best]):
                cand, raw = _candidates(z, temp, int(top_k[b]), float(top_p[b]),
                                        float(min_p[b]))
                standard = q is not None and drafted
                if standard:
                    ok, tok = _standard_test(cand, raw, q[b, j, :V], d, V, seed_lo, seed_hi,
                                             position)
                else:  # the sampler's own race: the decode program's token
                    tok = _race(cand, raw, seed_lo, seed_hi, position)
            if not standard:
                ok = drafted and tok == d
            accepted += ok
            out.append(tok)
            counts[tok] += 1
            if not ok:
                break
        if sampling_decision[b] != 0:
            np.add.at(histogram[s], np.asarray(out, np.int64), 1)
        pending[s] = out[-1]
        cursor = start + accepted + 1 - LAG if LAG >= 0 else -1
        rec[b, :RECORD_FIELDS] = (int(generation[b]), n, accepted, accepted + 1,
                                  max(cursor, 0) if LAG >= 0 else -1, -1)
        rec[b, RECORD_FIELDS:RECORD_FIELDS + len(out)] = out
        commit_row[off:off + accepted + 1] = b


def _standard_test(cand: NDArray[np.int64], raw: NDArray[np.float32], qrow: NDArray[np.float32],
                   d: int, V: int, seed_lo: int, seed_hi: int, position: int
                   ) -> tuple[bool, int]:
    """Standard speculative sampling of one drafted row (`spec_verify`): (True, d) when
    `d` is accepted, else (False, the residual draw)."""
    p = raw / raw.sum(dtype=np.float32)
    dense_p = _lane_ids(cand, p, V)
    # A draft outside [0, V) (cut by spec_candidate_masks) is never accepted and proposed
    # nothing: its rejection draws from p.
    valid = 0 <= d < V
    if not valid:
        qrow = np.zeros(V, np.float32)
    u = philox_uniform(seed_lo, seed_hi, position, [0], stream=STREAM_ACCEPT)[0]
    if valid and qrow[d] > 0 and u * np.float64(qrow[d]) < np.float64(dense_p[d]):
        return True, d
    residual = np.maximum(dense_p[cand] - qrow[cand], np.float32(0))
    total = residual.sum(dtype=np.float32)
    weights = residual / total if total > 0 else p
    return False, _race(cand, weights, seed_lo, seed_hi, position, STREAM_RESIDUAL)


def paged_row_write(
    x: NDArray[np.float32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    plane: NDArray[np.float32],
    T: int,
    R: int,
    MP: int,
    PT: int,
    D: int,
) -> None:
    """Store each real token's row of `x` in its request's paged plane.

    Reference loop::

        for t in range(T):
            r = token_row[t]
            if r < 0 or slot[r] < 0: continue
            page = page_table[slot[r], positions[t] // PT]
            plane[page, positions[t] % PT, :] = x[t, :D]

    Args:
        x: ``[T, D]`` f32 rows (target features). positions, token_row: ``[T]`` i32.
        slot: ``[R]`` i32. page_table: ``[S, MP]`` i32. plane: ``[P, PT, D]`` f32, written.
        T: packed tokens. R: rows. MP: page-table width. PT: tokens per page. D: width.

    Raises:
        IndexError: a real token's position outside the page table (misuse).
    """
    rows = token_row[:T]
    t_idx = np.flatnonzero(rows >= 0)
    s = slot[:R][rows[t_idx]]
    keep = s >= 0
    t_idx, s = t_idx[keep], s[keep]
    if t_idx.size == 0:
        return
    pos = positions[t_idx].astype(np.int64)
    if pos.min() < 0 or (pos // PT).max() >= MP:
        raise IndexError(f"positions {int(pos.min())}..{int(pos.max())} outside MP={MP} pages")
    plane[page_table[s, pos // PT], pos % PT, :D] = x[t_idx, :D]


def paged_row_gather_prev(
    plane: NDArray[np.float32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    slot: NDArray[np.int32],
    page_table: NDArray[np.int32],
    out: NDArray[np.float32],
    T: int,
    R: int,
    MP: int,
    PT: int,
    D: int,
) -> None:
    """Each real token's row of the previous position (the head's feature input f_{j-1}).

    Reference loop::

        for t in range(T):
            r = token_row[t]; j = positions[t]
            if r < 0 or slot[r] < 0 or j < 1: out[t] = 0; continue
            page = page_table[slot[r], (j - 1) // PT]
            out[t, :] = plane[page, (j - 1) % PT, :D]

    Args:
        plane: ``[P, PT, D]`` f32. positions, token_row: ``[T]`` i32. slot: ``[R]`` i32.
        page_table: ``[S, MP]`` i32. out: ``[T, D]`` f32, written.
        T: packed tokens. R: rows. MP: page-table width. PT: tokens per page. D: width.
    """
    o = out[:T, :D]
    o[...] = 0.0
    rows = token_row[:T]
    t_idx = np.flatnonzero(rows >= 0)
    s = slot[:R][rows[t_idx]]
    prev = positions[t_idx].astype(np.int64) - 1
    keep = (s >= 0) & (prev >= 0)
    t_idx, s, prev = t_idx[keep], s[keep], prev[keep]
    if t_idx.size == 0:
        return
    o[t_idx] = plane[page_table[s, prev // PT], prev % PT, :D]


# -- copied proposals (history drafting) and prefix-limit allocation --------------------


def _fresh_candidates(count: NDArray[np.int32], cand_generation: NDArray[np.int32],
                      cand_endpoint: NDArray[np.int32], generation: NDArray[np.int32],
                      lane_start: NDArray[np.int32], query_length: NDArray[np.int32],
                      B: int, CMAX: int, DMAX: int) -> NDArray[np.int64]:
    """Copied candidates each lane may use: its count, clipped to [0, min(CMAX, DMAX,
    n_b - 1)], when the candidates were proposed for the lane's slot generation and its
    consumed endpoint (the pending token's position); 0 otherwise (stale: ignored)."""
    fresh = (cand_generation[:B] == generation[:B]) & (cand_endpoint[:B] == lane_start[:B])
    cap = np.minimum(np.minimum(CMAX, DMAX), np.maximum(query_length[:B].astype(np.int64) - 1,
                                                        0))
    return np.where(fresh, np.clip(count[:B].astype(np.int64), 0, cap), 0)


def spec_copy_candidates(
    cand_ids: NDArray[np.int32],
    cand_count: NDArray[np.int32],
    cand_generation: NDArray[np.int32],
    cand_endpoint: NDArray[np.int32],
    generation: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    query_length: NDArray[np.int32],
    lane_slot: NDArray[np.int32],
    drafts: NDArray[np.int32],
    q: NDArray[np.float32],
    B: int,
    CMAX: int,
    DMAX: int,
    V: int,
    STEP: int,
) -> None:
    """Replace draft STEP by the lane's copied candidate (history drafting), one-hot q
    (the op of cores exported before coupled verification; new cores: `spec_copy_drafts`).

    Runs right after ``draft_sample`` of step STEP. Copied candidate i (0-based) proposes
    the token at position c + 1 + i (c = the lane's pending position); the head's later
    steps read it as their input token, so learned drafts continue after the copied run.
    A copied draft is a deterministic proposal: its q row is one-hot (accepted with
    probability p(d), residual = p without d, renormalized: Leviathan et al. 2023 with
    q = delta_d); greedy lanes accept it iff it is the argmax.

    Reference loop::

        for b in range(B):
            k = count[b] clipped to [0, min(CMAX, DMAX, query_length[b] - 1)]
                if cand_generation[b] == generation[b] and cand_endpoint[b] == lane_start[b]
                else 0                                   # stale candidates are ignored
            d = cand_ids[b, STEP - 1]
            if lane_slot[b] < 0 or STEP > k or not 0 <= d < V: continue
            drafts[b, STEP - 1] = d
            q[b, STEP - 1, :] = 0; q[b, STEP - 1, d] = 1

    (A candidate id outside [0, V) ends the copied run: the step keeps the head's draft.)

    Args:
        cand_ids: ``[B, CMAX]`` i32 copied ids (CANDIDATE_IDS). cand_count,
            cand_generation, cand_endpoint: ``[B]`` i32 (CANDIDATE_COUNT /
            _GENERATION / _CONSUMED_ENDPOINT). generation, lane_start, query_length:
            ``[B]`` i32 of the lane. lane_slot: ``[B]`` i32 from ``spec_draft_inputs``
            (< 0: the lane skips this step).
        drafts: ``[B, DMAX]`` i32, column STEP - 1 rewritten. q: ``[B, DMAX, V]`` f32,
            row (b, STEP - 1) rewritten.
        B: lanes. CMAX: candidate columns. DMAX: draft columns. V: target vocabulary.
        STEP: 1..D.
    """
    if STEP > CMAX:
        return
    k = _fresh_candidates(cand_count, cand_generation, cand_endpoint, generation, lane_start,
                          query_length, B, CMAX, DMAX)
    for b in range(B):
        d = int(cand_ids[b, STEP - 1])
        if lane_slot[b] < 0 or STEP > k[b] or not 0 <= d < V:
            continue
        drafts[b, STEP - 1] = d
        q[b, STEP - 1, :V] = 0.0
        q[b, STEP - 1, d] = 1.0


def spec_candidate_masks(
    logits: NDArray[np.float32],
    token_row: NDArray[np.int32],
    positions: NDArray[np.int32],
    slot: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    query_length: NDArray[np.int32],
    use_mask: NDArray[np.int32],
    cand_masks: NDArray[np.int32],
    cand_count: NDArray[np.int32],
    cand_generation: NDArray[np.int32],
    cand_endpoint: NDArray[np.int32],
    generation: NDArray[np.int32],
    drafts: NDArray[np.int32],
    P: int,
    B: int,
    V: int,
    W32: int,
    CMAX: int,
    DMAX: int,
) -> None:
    """Per-position grammar masks of a constrained lane's copied candidates
    (CANDIDATE_GRAMMAR_MASKS; the specification's value sources, "Copied proposals").

    Runs after the verification rows' logits, before ``spec_verify``. A lane whose
    grammar mask applies (``use_mask``) verifies only its fresh copied candidates: the
    host advanced its grammar along them and sent the mask of every position after one
    (mask i = the tokens allowed after candidates 0..i), while learned drafts are drawn
    inside the program, where no host grammar can mask them. Row j of such a lane
    (j = position - lane start) gets mask j - 1 for 1 <= j <= k (row 0 keeps the lane's
    GRAMMAR_MASK, which ``spec_verify`` applies), and every draft it would test past the
    copied run (index >= k) becomes -1, which no verification accepts: the lane's token
    at row k is the target's own. k is ``spec_copy_candidates``' fresh count, so stale
    candidates (another generation or endpoint) give k = 0: their masks are ignored and
    the lane verifies its pending position only, as a width-one lane does. Lanes
    without a mask are untouched. Consumes no random draws.

    Reference loop::

        for t in range(P):
            b = token_row[t]
            if b < 0 or slot[b] < 0 or not use_mask[b]: continue
            k = fresh count of lane b (spec_copy_candidates)
            j = positions[t] - lane_start[b]
            if 1 <= j <= k: logits[t, v] = -inf for every v with bit v of
                                cand_masks[slot[b], j - 1] clear
            if k <= j < min(query_length[b] - 1, DMAX): drafts[b, j] = -1

    Args:
        logits: ``[P, V]`` f32 target logits of the packed rows, masked in place.
        token_row, positions: ``[P]`` i32 lane and position of each packed row (< 0 pad).
        slot, lane_start, query_length, use_mask: ``[B]`` i32 (query_length: the lane's
            actual length; a prefix-limit program's allocated one).
        cand_masks: ``[S, CMAX, W32]`` i32 bitmasks per physical request row (bit v % 32
            of word v // 32 allows v): persistent state the host uploads only for the
            slots of constrained lanes, so other steps copy nothing.
        cand_count, cand_generation, cand_endpoint, generation: ``[B]`` i32.
        drafts: ``[B, DMAX]`` i32 target ids, cut in place.
        P: packed rows. B: lanes. V: vocabulary. W32: mask words. CMAX: candidate
        columns. DMAX: draft columns.
    """
    k = _fresh_candidates(cand_count, cand_generation, cand_endpoint, generation, lane_start,
                          query_length, B, CMAX, DMAX)
    for t in range(P):
        b = int(token_row[t])
        if b < 0 or slot[b] < 0 or not use_mask[b]:
            continue
        j = int(positions[t]) - int(lane_start[b])
        if 1 <= j <= k[b]:
            allowed = _allowed(cand_masks[int(slot[b]), j - 1, :W32], V)
            logits[t, :V] = np.where(allowed, logits[t, :V], np.float32(-np.inf))
        if k[b] <= j < min(int(query_length[b]) - 1, DMAX):
            drafts[b, j] = -1


def spec_copy_drafts(
    cand_ids: NDArray[np.int32],
    cand_count: NDArray[np.int32],
    cand_generation: NDArray[np.int32],
    cand_endpoint: NDArray[np.int32],
    generation: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    query_length: NDArray[np.int32],
    lane_slot: NDArray[np.int32],
    drafts: NDArray[np.int32],
    B: int,
    CMAX: int,
    DMAX: int,
    V: int,
    STEP: int,
) -> None:
    """`spec_copy_candidates` of coupled programs: the same replacement of draft STEP by
    a fresh copied candidate, with no q to write (`spec_verify_coupled` accepts a copied
    draft iff it is the target's draw there: probability p(d)).

    Reference loop::

        for b in range(B):
            k = fresh candidate count of lane b (as spec_copy_candidates)
            d = cand_ids[b, STEP - 1]
            if lane_slot[b] >= 0 and STEP <= k and 0 <= d < V: drafts[b, STEP - 1] = d

    Args: as `spec_copy_candidates`, without q.
    """
    if STEP > CMAX:
        return
    k = _fresh_candidates(cand_count, cand_generation, cand_endpoint, generation, lane_start,
                          query_length, B, CMAX, DMAX)
    d = cand_ids[:B, STEP - 1]
    take = (lane_slot[:B] >= 0) & (STEP <= k) & (d >= 0) & (d < V)
    drafts[:B, STEP - 1] = np.where(take, d, drafts[:B, STEP - 1])


def spec_confidence(
    logits: NDArray[np.float32],
    lane_slot: NDArray[np.int32],
    drafts: NDArray[np.int32],
    vocab_map: NDArray[np.int32],
    confidence: NDArray[np.float32],
    B: int,
    VD: int,
    DMAX: int,
    STEP: int,
) -> None:
    """The head's confidence in draft STEP: its softmax probability (temperature 1, no
    truncation) of the drafted token, 0 when the token is outside the draft vocabulary
    (a copied candidate may be). Fresh and causal: step STEP's logits see only the lane's
    tokens up to its draft STEP - 1. Consumes no random draws.

    Reference loop::

        for b in range(B):
            if lane_slot[b] < 0: continue
            z = logits[b, :VD]; e = exp(z - max(z))
            k = first index with vocab_map[k] == drafts[b, STEP - 1], else none
            confidence[b, STEP - 1] = e[k] / sum(e) if k else 0      # f32

    Args:
        logits: ``[B, VD]`` f32 head logits of step STEP. lane_slot: ``[B]`` i32.
        drafts: ``[B, DMAX]`` i32 target ids. vocab_map: ``[VD]`` i32.
        confidence: ``[B, DMAX]`` f32, column STEP - 1 written for live lanes.
        B: lanes. VD: draft vocabulary. DMAX: draft columns. STEP: 1..D.
    """
    for b in range(B):
        if lane_slot[b] < 0:
            continue
        z = logits[b, :VD].astype(np.float32, copy=False)
        e = np.exp(z - z.max())
        hit = np.flatnonzero(vocab_map[:VD] == drafts[b, STEP - 1])
        confidence[b, STEP - 1] = e[hit[0]] / e.sum(dtype=np.float32) if hit.size else 0.0


def spec_allocate(
    ceiling: NDArray[np.int32],
    slot: NDArray[np.int32],
    confidence: NDArray[np.float32],
    query_length: NDArray[np.int32],
    B: int,
    P: int,
    DMAX: int,
) -> None:
    """Allocate the P verification rows among lanes as causal prefixes (the specification,
    "Complete speculative generation": device allocation; SPECULATIVE_PREFIX_LIMIT).

    Every live lane (slot >= 0, ceiling >= 1) starts with its pending position. Then,
    while rows remain, the lane whose next position has the highest survival probability
    -- the product of its drafts' confidences up to and including that position, FP32
    values multiplied in FP64 -- gets it; ties prefer the shorter prefix, then the lower
    slot. A lane never exceeds its ceiling (nor 1 + DMAX), and a position is offered only
    after all its predecessors (later confidence cannot admit a predecessor). Negative or
    NaN confidences count as 0. Consumes no random draws.

    Reference loop::

        n = [1 if slot[b] >= 0 and ceiling[b] >= 1 else 0 for b in range(B)]
        survival = [1.0] * B                                        # float64
        for _ in range(P - sum(n)):
            open = [b for b in range(B) if 1 <= n[b] < min(ceiling[b], DMAX + 1)]
            if not open: break
            b = max(open, key=lambda b: (survival[b] * f64(conf[b, n[b] - 1]), -n[b],
                                         -slot[b], -b))
            survival[b] *= f64(conf[b, n[b] - 1]); n[b] += 1
        query_length[:B] = n

    Args:
        ceiling: ``[B]`` i32 immutable per-lane ceilings (SPECULATIVE_PREFIX_LIMIT).
        slot: ``[B]`` i32 (< 0 padding). confidence: ``[B, DMAX]`` f32.
        query_length: ``[B]`` i32, written (the actual lane lengths).
        B: lanes. P: packed verification rows. DMAX: draft columns.

    Raises:
        ValueError: fewer rows than live lanes (P < lanes: the capture guarantees P >= B).
    """
    live = (slot[:B] >= 0) & (ceiling[:B] >= 1)
    n = live.astype(np.int64)
    if n.sum() > P:
        raise ValueError(f"{int(n.sum())} live lanes exceed P = {P} rows")
    limit = np.minimum(ceiling[:B].astype(np.int64), DMAX + 1)
    conf = np.nan_to_num(confidence[:B, :DMAX].astype(np.float64), nan=0.0)
    conf = np.maximum(conf, 0.0)
    survival = np.ones(B, np.float64)
    for _ in range(P - int(n.sum())):
        best = None
        for b in range(B):
            if not (1 <= n[b] < limit[b]):
                continue
            key = (survival[b] * conf[b, n[b] - 1], -n[b], -int(slot[b]), -b)
            if best is None or key > best[0]:
                best = (key, b)
        if best is None:
            break
        b = best[1]
        survival[b] *= conf[b, n[b] - 1]
        n[b] += 1
    query_length[:B] = n


def spec_pack_rows(
    query_length: NDArray[np.int32],
    lane_start: NDArray[np.int32],
    slot: NDArray[np.int32],
    positions: NDArray[np.int32],
    token_row: NDArray[np.int32],
    token_slot: NDArray[np.int32],
    B: int,
    P: int,
) -> None:
    """Pack the verification rows of device-allocated lane lengths (what the host packs
    for QUERY_LENGTH programs): lane b's n_b rows follow the earlier lanes' rows.

    Reference loop::

        t = 0
        for b in range(B):
            for j in range(query_length[b]):
                positions[t] = lane_start[b] + j; token_row[t] = b; token_slot[t] = slot[b]
                t += 1
        positions[t:P] = 0; token_row[t:P] = -1; token_slot[t:P] = -1      # padding

    Args:
        query_length, lane_start, slot: ``[B]`` i32 (lengths sum to at most P).
        positions, token_row, token_slot: ``[P]`` i32, written.
        B: lanes. P: packed rows.
    """
    n = np.maximum(query_length[:B].astype(np.int64), 0)
    total = int(n.sum())
    assert total <= P, "allocation exceeded P"
    rows = np.repeat(np.arange(B), n)
    offsets = np.concatenate([[0], np.cumsum(n)[:-1]]) if B else n
    j = np.arange(total) - np.repeat(offsets, n)
    positions[:total] = lane_start[:B][rows] + j
    token_row[:total] = rows
    token_slot[:total] = slot[:B][rows]
    positions[total:P] = 0
    token_row[total:P] = -1
    token_slot[total:P] = -1
