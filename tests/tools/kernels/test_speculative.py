"""NumPy references of the speculative ops (helios_tools/kernels/speculative.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helios_tools.kernels import sample
from helios_tools.kernels.sampling import _candidates
from helios_tools.kernels.speculative import (
    RECORD_FIELDS,
    paged_row_gather_prev,
    paged_row_write,
    spec_draft_inputs,
    spec_pack_tokens,
    spec_verify,
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
