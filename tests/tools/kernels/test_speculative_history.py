"""NumPy references of history drafting and prefix-limit allocation (model-contract.md,
"Complete speculative generation": copied proposals, SPECULATIVE_PREFIX_LIMIT).

The allocation cases are crafted by hand: equal survival products (exact in binary
floating point, so the tie rule decides), ties between lanes of equal prefixes (the
lower slot wins), a ceiling that stops a confident lane, zero and NaN confidences, and
the FP64 product (FP32 products of the same values would tie where FP64 does not)."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import (
    spec_allocate,
    spec_confidence,
    spec_copy_candidates,
    spec_pack_rows,
)


def _allocate(ceiling, confidence, P, slot=None):
    B = len(ceiling)
    conf = np.asarray(confidence, np.float32).reshape(B, -1)
    out = np.full(B, -9, np.int32)
    slot = np.arange(B, dtype=np.int32) if slot is None else np.asarray(slot, np.int32)
    spec_allocate(np.asarray(ceiling, np.int32), slot, conf, out, B, P, conf.shape[1])
    return out.tolist()


def test_each_lane_keeps_its_pending_position_and_the_best_frontier_wins():
    # Survival of lane 0's positions: .9, .81, .729; lane 1: .5, .25, .125.
    conf = [[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]]
    assert _allocate([4, 4], conf, P=2) == [1, 1]
    assert _allocate([4, 4], conf, P=4) == [3, 1]
    assert _allocate([4, 4], conf, P=5) == [4, 1]
    assert _allocate([4, 4], conf, P=6) == [4, 2]
    assert _allocate([4, 4], conf, P=8) == [4, 4]
    assert _allocate([4, 4], conf, P=9) == [4, 4]  # every ceiling reached: rows stay free


def test_equal_products_prefer_the_shorter_prefix_then_the_lower_slot():
    # 0.5 * 0.5 == 0.25 exactly: lane 0's second draft ties lane 1's first; shorter wins.
    assert _allocate([3, 3], [[0.5, 0.5], [0.25, 0.25]], P=3) == [2, 1]
    assert _allocate([3, 3], [[0.5, 0.5], [0.25, 0.25]], P=4) == [2, 2]
    # Same prefix length and equal products: the lower slot, whatever the lane order.
    assert _allocate([2, 2], [[0.5], [0.5]], P=3, slot=[5, 2]) == [1, 2]
    assert _allocate([2, 2], [[0.5], [0.5]], P=3, slot=[2, 5]) == [2, 1]
    # A tie between a length-3 frontier (0.5^3) and a length-2 one (0.125): shorter first.
    assert _allocate([4, 4], [[0.5, 0.5, 0.5], [0.125, 1.0, 1.0]], P=4) == [3, 1]
    assert _allocate([4, 4], [[0.5, 0.5, 0.5], [0.125, 1.0, 1.0]], P=5) == [3, 2]


def test_products_are_taken_in_float64():
    # Lane 0's second position has survival a * b; lane 1's first has c = f32(a * b). In
    # FP32 the two tie (and the shorter prefix, lane 1, would win); in FP64 a * b > c.
    a, b = np.float32(0.7), np.float32(0.5244898)
    c = np.float32(a * b)
    assert float(a) * float(b) > float(c)
    assert _allocate([3, 2], [[a, b], [c, 0.0]], P=4) == [3, 1]
    # With lane 1's confidence one f32 step above, lane 1 wins the tie-free comparison.
    up = np.nextafter(c, np.float32(1))
    assert float(up) > float(a) * float(b)
    assert _allocate([3, 2], [[a, b], [up, 0.0]], P=4) == [2, 2]


def test_ceilings_zero_nan_and_padding_lanes():
    # Lane 0 is confident but its ceiling is 2; lane 1 (ceiling 1) never grows.
    assert _allocate([2, 1, 4], [[1.0, 1.0], [1.0, 1.0], [0.1, 0.1]], P=6) == [2, 1, 3]
    # NaN and negative confidences count as 0: allocated last, still causal.
    assert _allocate([3, 3], [[np.nan, 1.0], [-1.0, 1.0]], P=3) == [2, 1]
    assert _allocate([3, 3], [[np.nan, 1.0], [0.01, 1.0]], P=3) == [1, 2]
    # A padding lane (slot -1) and a lane with ceiling 0 get no row.
    assert _allocate([4, 4, 0], [[0.5] * 3, [0.9] * 3, [1.0] * 3], P=4,
                     slot=[0, -1, 2]) == [4, 0, 0]


def test_later_confidence_cannot_admit_a_predecessor():
    # Lane 0's second draft is certain but its first is weak: the certain one waits for it.
    assert _allocate([3, 3], [[0.1, 1.0], [0.5, 0.5]], P=4) == [1, 3]
    # P = 5: lane 1 full (ceiling 3), then lane 0's first draft, never its second alone.
    assert _allocate([3, 3], [[0.1, 1.0], [0.5, 0.5]], P=5) == [2, 3]


def test_fewer_rows_than_live_lanes_is_refused():
    with pytest.raises(ValueError, match="3 live lanes exceed P = 2"):
        _allocate([1, 1, 1], [[0.5], [0.5], [0.5]], P=2)


def test_pack_rows_follows_the_allocated_lengths():
    B, P = 3, 8
    out = [np.full(P, 99, np.int32) for _ in range(3)]
    spec_pack_rows(np.asarray([2, 0, 3], np.int32), np.asarray([10, 20, 30], np.int32),
                   np.asarray([4, -1, 6], np.int32), *out, B, P)
    positions, token_row, token_slot = (o.tolist() for o in out)
    assert positions == [10, 11, 30, 31, 32, 0, 0, 0]
    assert token_row == [0, 0, 2, 2, 2, -1, -1, -1]
    assert token_slot == [4, 4, 6, 6, 6, -1, -1, -1]


def _copy(step, *, count=2, cand_generation=7, cand_endpoint=40, qlen=4, lane_slot=3):
    B, CMAX, DMAX, V = 1, 3, 3, 16
    drafts = np.asarray([[1, 2, 3]], np.int32)
    q = np.full((B, DMAX, V), 0.25, np.float32)
    spec_copy_candidates(np.asarray([[9, 10, 11]], np.int32), np.asarray([count], np.int32),
                         np.asarray([cand_generation], np.int32),
                         np.asarray([cand_endpoint], np.int32), np.asarray([7], np.int32),
                         np.asarray([40], np.int32), np.asarray([qlen], np.int32),
                         np.asarray([lane_slot], np.int32), drafts, q, B, CMAX, DMAX, V, step)
    return drafts[0].tolist(), q[0]


def test_fresh_candidates_replace_the_drafts_with_one_hot_proposals():
    drafts, q = _copy(1)
    assert drafts == [9, 2, 3] and q[0, 9] == 1.0 and q[0].sum() == 1.0
    assert (q[1] == 0.25).all()
    assert _copy(2)[0] == [1, 10, 3]
    assert _copy(3)[0] == [1, 2, 3]  # only 2 candidates


@pytest.mark.parametrize("stale", [{"cand_generation": 6}, {"cand_endpoint": 39},
                                   {"count": 0}, {"lane_slot": -1}, {"qlen": 1}])
def test_stale_or_unusable_candidates_are_ignored(stale):
    drafts, q = _copy(1, **stale)
    assert drafts == [1, 2, 3] and (q == 0.25).all()


def test_a_lane_uses_no_more_candidates_than_its_drafts():
    assert _copy(2, qlen=2)[0] == [1, 2, 3]  # one draft position: only candidate 0 fits
    assert _copy(1, qlen=2)[0] == [9, 2, 3]


def test_confidence_is_the_heads_softmax_probability_of_the_draft():
    logits = np.asarray([[0.0, np.log(3.0), 0.0, 0.0]], np.float32)
    vocab_map = np.asarray([5, 6, 7, 8], np.int32)
    conf = np.full((1, 2), -1.0, np.float32)
    spec_confidence(logits, np.asarray([0], np.int32), np.asarray([[6, 9]], np.int32),
                    vocab_map, conf, 1, 4, 2, 1)
    assert conf[0, 0] == pytest.approx(0.5, rel=1e-6) and conf[0, 1] == -1.0
    spec_confidence(logits, np.asarray([0], np.int32), np.asarray([[6, 9]], np.int32),
                    vocab_map, conf, 1, 4, 2, 2)
    assert conf[0, 1] == 0.0  # 9 is outside the draft vocabulary (a copied token)
