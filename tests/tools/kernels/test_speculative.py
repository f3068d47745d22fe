"""NumPy references of the speculative ops (helios_tools/kernels/speculative.py): the
standard speculative sampling ops of cores exported before coupled verification
(spec_verify, ...) and the coupled ones of new cores (spec_verify_coupled, ...)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helios_tools.kernels import sample, sample_biased
from helios_tools.kernels.sampling import _candidates
from helios_tools.kernels.speculative import (
    RECORD_FIELDS,
    draft_sample_coupled,
    paged_row_gather_prev,
    paged_row_write,
    spec_copy_drafts,
    spec_draft_inputs,
    spec_pack_tokens,
    spec_verify,
    spec_verify_coupled,
)

V, VD, B, W = 40, 24, 3, 4
DMAX = W - 1


def _verify(logits, drafts, qlen, start, *, temperature=0.0, top_p=1.0, q=None,
            histogram=None, seed=(1, 2), sampling_decision=1):
    """spec_verify over B lanes (lane b's seed is (seed[0] * B + b, seed[1]))."""
    P = int(sum(qlen))
    slot = np.arange(B, dtype=np.int32)
    hist = np.zeros((B, V), np.int32) if histogram is None else histogram
    pending = np.full(B, -5, np.int32)
    commit = np.zeros(P, np.int32)
    record = np.zeros((B, RECORD_FIELDS + W), np.int32)
    vocab_map = np.arange(VD, dtype=np.int32) * 1 + 8  # draft ids -> target ids 8..31
    token_row = np.repeat(np.arange(B, dtype=np.int32), qlen)
    f = np.float32
    spec_verify(
        logits, slot, np.full(B, 7, np.int32), np.asarray(start, np.int32),
        np.asarray(qlen, np.int32), np.full(B, sampling_decision, np.int32),
        np.asarray([(seed[0] * B + b, seed[1]) for b in range(B)], np.uint32),
        np.full(B, temperature, f),
        np.full(B, top_p, f), np.zeros(B, np.int32), np.zeros(B, f), np.zeros(B, f),
        np.zeros(B, f), np.ones(B, f), hist, np.zeros((B, 2), np.int32), np.zeros(B, np.int32),
        np.asarray(drafts, np.int32),
        np.zeros((B, DMAX, V), f) if q is None else q, vocab_map, token_row, pending, commit,
        record, B, P, V, VD, 2, DMAX, W, 0)
    return record, pending, commit, hist


def test_greedy_accepts_the_matching_prefix_then_corrects():
    qlen = [4, 1, 3]
    P = sum(qlen)
    logits = np.zeros((P, V), np.float32)
    argmax = [10, 11, 12, 13, 20, 30, 31, 32]  # per packed row
    logits[np.arange(P), argmax] = 5.0
    drafts = [[10, 11, 99], [0, 0, 0], [30, 9, 0]]  # lane 0: 2 match then 99 != 12
    record, pending, commit, hist = _verify(logits, drafts, qlen, [5, 9, 3])
    assert record[0].tolist() == [7, 4, 2, 3, 5 + 3, -1, 10, 11, 12, -1]
    assert record[1].tolist() == [7, 1, 0, 1, 9 + 1, -1, 20, -1, -1, -1]
    assert record[2].tolist() == [7, 3, 1, 2, 3 + 2, -1, 30, 31, -1, -1]
    assert pending.tolist() == [12, 20, 31]
    # commit rows: the pending and accepted positions of each lane, -1 past them
    assert commit.tolist() == [0, 0, 0, -1, 1, 2, 2, -1]
    assert hist[0, [10, 11, 12]].tolist() == [1, 1, 1] and hist.sum() == 3 + 1 + 2


def test_all_drafts_accepted_emits_the_bonus_token():
    qlen = [4, 2, 1]
    P = sum(qlen)
    logits = np.zeros((P, V), np.float32)
    logits[np.arange(P), [1, 2, 3, 4, 5, 6, 7]] = 3.0
    record, pending, _, _ = _verify(logits, [[1, 2, 3], [5, 0, 0], [0, 0, 0]], qlen,
                                    [0, 0, 0])
    assert record[:, 2].tolist() == [3, 1, 0] and record[:, 3].tolist() == [4, 2, 1]
    assert record[0, RECORD_FIELDS:].tolist() == [1, 2, 3, 4]
    assert pending.tolist() == [4, 6, 7]


def test_width_one_lanes_sample_exactly_what_decode_samples():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((B, V)).astype(np.float32)
    for temperature in (0.0, 0.7):
        record, pending, _, _ = _verify(logits, np.zeros((B, DMAX)), [1, 1, 1], [4, 8, 12],
                                        temperature=temperature, top_p=0.9, seed=(3, 4))
        out = np.zeros(B, np.int32)
        f = np.float32
        sample(logits, np.arange(B, dtype=np.int32), np.asarray([4, 8, 12], np.int32),
               np.ones(B, np.int32), np.asarray([(3 * B + b, 4) for b in range(B)], np.uint32),
               np.full(B, temperature, f), np.full(B, 0.9, f), np.zeros(B, np.int32),
               np.zeros(B, f), np.zeros(B, f), np.zeros(B, f), np.ones(B, f),
               np.zeros((B, V), np.int32), np.zeros((B, 2), np.int32), np.zeros(B, np.int32),
               out, B, V, 2)
        assert record[:, RECORD_FIELDS].tolist() == out.tolist()


def test_draft_inputs_mask_lanes_that_skip_a_step_and_pack_tokens():
    pending = np.asarray([50, 51, 52, 53], np.int32)
    slot = np.asarray([2, 0, -1], np.int32)
    start = np.asarray([10, 20, 0], np.int32)
    qlen = np.asarray([3, 1, 0], np.int32)
    drafts = np.asarray([[60, 61, 62], [70, 71, 72], [0, 0, 0]], np.int32)
    outs = [np.zeros(3, np.int32) for _ in range(4)]
    spec_draft_inputs(pending, slot, start, qlen, drafts, *outs, 3, 4, 3, 1)
    assert [o.tolist() for o in outs] == [[52, 50, -1], [10, 20, 0], [0, 1, -1], [2, 0, -1]]
    spec_draft_inputs(pending, slot, start, qlen, drafts, *outs, 3, 4, 3, 2)
    assert [o.tolist() for o in outs] == [[60, -1, -1], [11, 0, 0], [0, -1, -1], [2, -1, -1]]
    tokens = np.zeros(6, np.int32)
    positions = np.asarray([10, 11, 12, 20, 0, 0], np.int32)
    token_row = np.asarray([0, 0, 0, 1, -1, -1], np.int32)
    spec_pack_tokens(pending, slot, start, drafts, positions, token_row, tokens, 3, 6, 4, 3)
    assert tokens.tolist() == [52, 60, 61, 50, -1, -1]


def test_paged_rows_round_trip_through_the_page_table():
    PT, D = 4, 3
    plane = np.zeros((8, PT, D), np.float32)
    page_table = np.asarray([[5, 2, 7], [1, 0, 3]], np.int32)
    x = np.arange(12, dtype=np.float32).reshape(4, D) + 1
    positions = np.asarray([3, 4, 0, 9], np.int32)
    token_row = np.asarray([0, 0, 1, -1], np.int32)
    slot = np.asarray([0, 1], np.int32)
    paged_row_write(x, positions, token_row, slot, page_table, plane, 4, 2, 3, PT, D)
    assert plane[5, 3].tolist() == x[0].tolist() and plane[2, 0].tolist() == x[1].tolist()
    assert plane[1, 0].tolist() == x[2].tolist() and plane[3].sum() == 0  # padding skipped
    out = np.full((4, D), 9.0, np.float32)
    paged_row_gather_prev(plane, np.asarray([4, 5, 1, 0], np.int32),
                          np.asarray([0, 0, 1, 0], np.int32), slot, page_table, out, 4, 2, 3, PT,
                          D)
    assert out.tolist() == [x[0].tolist(), x[1].tolist(), x[2].tolist(), [0.0] * D]


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_speculative_sampling_preserves_the_target_distribution(top_p):
    """Leviathan et al. 2023, Theorem 1: the first emitted token ~ p whatever q is. A
    q far from p (most mass where p has little) makes both paths -- acceptance with
    min(1, p/q) and the residual norm(max(p - q, 0)) -- carry weight; 6,000 seeded lanes,
    chi-square at significance 1e-3 against the sampler's own distribution (top-p
    truncated and renormalized when top_p < 1)."""
    z = np.full(V, -30.0, np.float32)
    z[8:14] = np.log(np.asarray([0.3, 0.25, 0.2, 0.12, 0.08, 0.05], np.float32))
    cand, probs = _candidates(z, 1.0, 0, top_p, 0.0)
    p = np.zeros(V)
    p[cand] = probs / probs.sum()
    q = np.zeros((B, DMAX, V), np.float32)
    q[:, 0, 8:14] = np.asarray([0.02, 0.03, 0.05, 0.1, 0.3, 0.5], np.float32)  # ids 8..13
    counts = np.zeros(V, np.int64)
    rng = np.random.default_rng(11)
    draws = 2000
    for i in range(draws):
        drafts = np.zeros((B, DMAX), np.int32)
        drafts[:, 0] = 8 + rng.choice(6, size=B, p=q[0, 0, 8:14] / q[0, 0, 8:14].sum())
        logits = np.tile(z, (2 * B, 1))
        record, _, _, _ = _verify(logits, drafts, [2] * B, [5] * B, temperature=1.0, q=q,
                                  seed=(i, 99), top_p=top_p)
        np.add.at(counts, record[:, RECORD_FIELDS], 1)
    n = counts.sum()
    keep = p * n >= 5
    stat = float((((counts[keep] - p[keep] * n) ** 2) / (p[keep] * n)).sum())
    k = int(keep.sum()) - 1
    zscore = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / np.sqrt(2 / (9 * k))
    assert 0.5 * math.erfc(zscore / math.sqrt(2)) > 1e-3, (stat, counts[8:14] / n, p[8:14])


# -- coupled verification (new cores) ---------------------------------------------------


def _verify_coupled(logits, drafts, qlen, start, *, temperature=0.0, top_p=1.0, seed=(1, 2),
                    presence=0.0):
    """spec_verify_coupled over B lanes (lane b's seed is (seed[0] * B + b, seed[1]))."""
    P = int(sum(qlen))
    slot = np.arange(B, dtype=np.int32)
    hist = np.zeros((B, V), np.int32)
    pending = np.full(B, -5, np.int32)
    commit = np.zeros(P, np.int32)
    record = np.zeros((B, RECORD_FIELDS + W), np.int32)
    token_row = np.repeat(np.arange(B, dtype=np.int32), qlen)
    f = np.float32
    spec_verify_coupled(
        logits, slot, np.full(B, 7, np.int32), np.asarray(start, np.int32),
        np.asarray(qlen, np.int32), np.ones(B, np.int32),
        np.asarray([(seed[0] * B + b, seed[1]) for b in range(B)], np.uint32),
        np.full(B, temperature, f), np.full(B, top_p, f), np.zeros(B, np.int32),
        np.zeros(B, f), np.full(B, presence, f), np.zeros(B, f), np.ones(B, f), hist,
        np.zeros((B, 2), np.int32), np.zeros(B, np.int32), np.asarray(drafts, np.int32),
        token_row, pending, commit, record, B, P, V, 2, DMAX, W, 0)
    return record, pending, commit, hist


def _decode_draws(logits_rows, positions, seed, temperature, top_p, presence=0.0,
                  history=None):
    """The decode sampler's token per row (sample_biased), one row at a time."""
    out = []
    f = np.float32
    hist = np.zeros((1, V), np.int32) if history is None else history
    for z, pos in zip(logits_rows, positions, strict=True):
        tok = np.zeros(1, np.int32)
        sample_biased(z[None].astype(f), np.zeros(1, np.int32), np.asarray([pos], np.int32),
                      np.ones(1, np.int32), np.asarray([seed], np.uint32), np.full(1, temperature, f),
                      np.full(1, top_p, f), np.zeros(1, np.int32), np.zeros(1, f),
                      np.full(1, presence, f), np.zeros(1, f), np.ones(1, f), hist,
                      np.zeros((1, V), f), np.zeros(1, np.int32), np.zeros((1, 2), np.int32),
                      np.zeros(1, np.int32), tok, 1, V, 2)
        out.append(int(tok[0]))
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_coupled_verify_emits_the_decode_samplers_draw_at_every_position(temperature):
    """Whatever the drafts, the emitted token at each position is what sample_biased
    draws there for the same seed (presence penalty on: accepted drafts count in the
    next row's penalties as decode's histogram would); a draft equal to it is accepted."""
    rng = np.random.default_rng(3)
    qlen, start = [4, 4, 2], [5, 9, 30]
    P = sum(qlen)
    logits = (rng.standard_normal((P, V)) * 2).astype(np.float32)
    off = np.concatenate([[0], np.cumsum(qlen)[:-1]])
    drafts = np.full((B, DMAX), -1, np.int32)
    for _ in range(DMAX):  # grow each lane's accepted run to the full lane
        record, _, _, _ = _verify_coupled(logits, drafts, qlen, start, temperature=temperature,
                                          top_p=0.9, presence=0.7)
        for b in range(B):
            a = record[b, 2]
            if a < qlen[b] - 1:
                drafts[b, a] = record[b, RECORD_FIELDS + a]
    drafts[1, 2] = (drafts[1, 2] + 1) % V  # lane 1 rejects its last draft
    record, pending, commit, hist = _verify_coupled(logits, drafts, qlen, start,
                                                    temperature=temperature, top_p=0.9,
                                                    presence=0.7)
    assert record[:, 2].tolist() == [3, 2, 1] and record[:, 3].tolist() == [4, 3, 2]
    for b in range(B):
        history = np.zeros((1, V), np.int32)
        n = int(record[b, 3])
        want = _decode_draws(logits[off[b]:off[b] + n], range(start[b], start[b] + n),
                             (1 * B + b, 2), temperature, 0.9, presence=0.7, history=history)
        assert record[b, RECORD_FIELDS:RECORD_FIELDS + n].tolist() == want
        assert pending[b] == want[-1]
    assert commit.tolist() == [0, 0, 0, 0, 1, 1, 1, -1, 2, 2]


def test_coupled_drafts_from_the_targets_distribution_are_always_accepted():
    """The head races with the target's noise: with q = p (the head's logits are the
    target's over the draft vocabulary, and the target puts no mass elsewhere) every
    sampled draft equals the target's draw, so every lane accepts all its drafts."""
    rng = np.random.default_rng(5)
    vocab_map = np.arange(VD, dtype=np.int32) + 8
    f = np.float32
    for trial in range(20):
        z = np.full((B, V), -1e9, f)
        z[:, 8:8 + VD] = (rng.standard_normal((B, VD)) * 2).astype(f)
        start = rng.integers(0, 100, B).astype(np.int32)
        drafts = np.full((B, DMAX), -1, np.int32)
        seeds = np.asarray([(trial * B + b, 2) for b in range(B)], np.uint32)
        for step in range(1, DMAX + 1):
            draft_sample_coupled(z[:, 8:8 + VD].copy(), np.arange(B, dtype=np.int32),
                                 start + step - 1, vocab_map, seeds, np.full(B, 0.8, f),
                                 np.full(B, 0.95, f), np.zeros(B, np.int32), np.zeros(B, f),
                                 drafts, B, VD, DMAX, step)
        logits = np.repeat(z, W, axis=0)  # every row of a lane sees the same distribution
        record, _, _, _ = _verify_coupled(logits, drafts, [W] * B, start, temperature=0.8,
                                          top_p=0.95, seed=(trial, 2))
        assert record[:, 2].tolist() == [DMAX] * B


def test_copy_drafts_replaces_only_fresh_in_range_candidates():
    cand = np.asarray([[4, 5, 6], [7, 8, 9], [1, 2, 3], [-1, 60, 2]], np.int32)
    drafts = np.zeros((4, DMAX), np.int32)
    gen = np.asarray([3, 3, 3, 3], np.int32)
    start = np.asarray([10, 10, 10, 10], np.int32)
    args = (cand, np.asarray([3, 3, 1, 3], np.int32), np.asarray([3, 2, 3, 3], np.int32),
            np.asarray([10, 10, 10, 10], np.int32), gen, start,
            np.asarray([4, 4, 4, 4], np.int32), np.asarray([0, 1, 2, 3], np.int32))
    for step in (1, 2):
        spec_copy_drafts(*args, drafts, 4, 3, DMAX, V, step)
    # lane 1: stale generation; lane 2: one candidate; lane 3: -1 ends the run, 60 >= V
    assert drafts.tolist() == [[4, 5, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_coupled_verification_emits_the_target_distribution(top_p):
    """The first emitted token of 2-row lanes ~ p (chi-square, significance 1e-3, 6,000
    seeded lanes) with the head's q far from p (drafts drawn by draft_sample_coupled)."""
    z = np.full(V, -30.0, np.float32)
    z[8:14] = np.log(np.asarray([0.3, 0.25, 0.2, 0.12, 0.08, 0.05], np.float32))
    cand, probs = _candidates(z, 1.0, 0, top_p, 0.0)
    p = np.zeros(V)
    p[cand] = probs / probs.sum()
    head = np.full((B, VD), -30.0, np.float32)
    head[:, :6] = np.log(np.asarray([0.02, 0.03, 0.05, 0.1, 0.3, 0.5], np.float32))
    vocab_map = np.arange(VD, dtype=np.int32) + 8
    counts = np.zeros(V, np.int64)
    accepted = 0
    f = np.float32
    for i in range(2000):
        seeds = np.asarray([(i * B + b, 99) for b in range(B)], np.uint32)
        drafts = np.full((B, DMAX), -1, np.int32)
        draft_sample_coupled(head, np.arange(B, dtype=np.int32), np.full(B, 5, np.int32),
                             vocab_map, seeds, np.ones(B, f), np.ones(B, f),
                             np.zeros(B, np.int32), np.zeros(B, f), drafts, B, VD, DMAX, 1)
        record, _, _, _ = _verify_coupled(np.tile(z, (2 * B, 1)), drafts, [2] * B, [5] * B,
                                          temperature=1.0, seed=(i, 99), top_p=top_p)
        np.add.at(counts, record[:, RECORD_FIELDS], 1)
        accepted += int(record[:, 2].sum())
    n = counts.sum()
    keep = p * n >= 5
    stat = float((((counts[keep] - p[keep] * n) ** 2) / (p[keep] * n)).sum())
    k = int(keep.sum()) - 1
    zscore = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / np.sqrt(2 / (9 * k))
    assert 0.5 * math.erfc(zscore / math.sqrt(2)) > 1e-3, (stat, counts[8:14] / n, p[8:14])
    assert 0 < accepted < n  # both the accept and the correction paths ran
