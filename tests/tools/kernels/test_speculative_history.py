"""NumPy references of history drafting and prefix-limit allocation (the specification,
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
    spec_candidate_masks,
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


# -- per-position grammar masks of copied candidates (spec_candidate_masks) ----------


def _bits(allowed: list[list[int]], V: int) -> np.ndarray:
    """int32 [rows, ceil(V / 32)] bitmasks allowing exactly `allowed[i]`."""
    words = np.zeros((len(allowed), (V + 31) // 32), np.uint32)
    for i, ids in enumerate(allowed):
        for t in ids:
            words[i, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return words.view(np.int32)


def _masked(use_mask, count, generation=(3, 3), endpoint=(10, 20), lengths=(4, 3)):
    """Two lanes (starts 10 and 20, lengths 4 and 3) packed into P = 8 rows (one pad)."""
    V, B, CMAX, DMAX, P = 40, 2, 3, 3, 8
    logits = np.arange(P * V, dtype=np.float32).reshape(P, V) / 100
    token_row = np.asarray([0] * lengths[0] + [1] * lengths[1] + [-1] * (P - sum(lengths)),
                           np.int32)
    positions = np.asarray([10 + j for j in range(lengths[0])] +
                           [20 + j for j in range(lengths[1])] + [0] * (P - sum(lengths)),
                           np.int32)
    # Masks are per physical request row: lane 0 runs in slot 3, lane 1 in slot 1.
    cand_masks = np.zeros((4, CMAX, (V + 31) // 32), np.int32)
    cand_masks[3] = _bits([[1, 33], [2], [3, 4]], V)
    cand_masks[1] = _bits([[5], [6], [7]], V)
    cand_masks[0] = cand_masks[2] = _bits([[0], [0], [0]], V)  # other slots: never read
    drafts = np.asarray([[11, 12, 13], [21, 22, 23]], np.int32)
    args = dict(slot=np.asarray([3, 1], np.int32), lane_start=np.asarray([10, 20], np.int32),
                query_length=np.asarray(lengths, np.int32),
                use_mask=np.asarray(use_mask, np.int32), cand_masks=cand_masks,
                cand_count=np.asarray(count, np.int32),
                cand_generation=np.asarray(generation, np.int32),
                cand_endpoint=np.asarray(endpoint, np.int32),
                generation=np.asarray([3, 3], np.int32))
    out = logits.copy()
    spec_candidate_masks(out, token_row, positions, args["slot"], args["lane_start"],
                         args["query_length"], args["use_mask"], args["cand_masks"],
                         args["cand_count"], args["cand_generation"], args["cand_endpoint"],
                         args["generation"], drafts, P, B, V, (V + 31) // 32, CMAX, DMAX)
    return logits, out, drafts


def _allowed_ids(row: np.ndarray) -> list[int]:
    return np.flatnonzero(np.isfinite(row)).tolist()


def test_rows_after_fresh_candidates_take_their_masks_and_later_drafts_are_cut():
    logits, out, drafts = _masked(use_mask=[1, 1], count=[2, 3])
    # Lane 0 (4 rows, 2 fresh candidates): row 0 keeps GRAMMAR_MASK's job (untouched),
    # rows 1 and 2 take masks 0 and 1; row 3 would follow the learned draft 2: its draft
    # is cut, so verification stops at row 2 at the latest.
    np.testing.assert_array_equal(out[0], logits[0])
    assert _allowed_ids(out[1]) == [1, 33] and _allowed_ids(out[2]) == [2]
    np.testing.assert_array_equal(out[3], logits[3])
    assert drafts[0].tolist() == [11, 12, -1]
    # Lane 1 (3 rows, count 3 clipped to n - 1 = 2): rows 1, 2 masked, nothing cut.
    np.testing.assert_array_equal(out[4], logits[4])
    assert _allowed_ids(out[5]) == [5] and _allowed_ids(out[6]) == [6]
    assert drafts[1].tolist() == [21, 22, 23]
    np.testing.assert_array_equal(out[7], logits[7])  # padding row


def test_lanes_without_a_grammar_mask_are_untouched():
    logits, out, drafts = _masked(use_mask=[0, 0], count=[2, 3])
    np.testing.assert_array_equal(out, logits)
    assert drafts.tolist() == [[11, 12, 13], [21, 22, 23]]


@pytest.mark.parametrize(("generation", "endpoint"),
                         [((2, 3), (10, 20)), ((3, 3), (11, 20)), ((3, 3), (9, 20))])
def test_stale_candidate_masks_are_ignored_and_the_lane_verifies_its_pending_row_only(
        generation, endpoint):
    logits, out, drafts = _masked(use_mask=[1, 1], count=[3, 2], generation=generation,
                                  endpoint=endpoint)
    # Lane 0's candidates are stale: no mask applied, every draft cut (row 0 decides).
    np.testing.assert_array_equal(out[:4], logits[:4])
    assert drafts[0].tolist() == [-1, -1, -1]
    assert _allowed_ids(out[5]) == [5] and _allowed_ids(out[6]) == [6]  # lane 1 fresh


def test_a_cut_draft_is_never_accepted_and_its_row_emits_the_targets_token():
    """spec_verify with a draft of -1 (greedy and sampled): the lane stops there; the
    sampled token is drawn from p itself (the q row of a cut draft is not used)."""
    from helios_tools.kernels import spec_verify

    V, B, P, W, DMAX = 8, 1, 3, 3, 2
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((P, V)).astype(np.float32)
    best0 = int(np.argmax(logits[0]))
    for temperature in (0.0, 0.9):
        q = np.zeros((B, DMAX, V), np.float32)
        q[0, 0, :] = 1.0 / V  # a learned draft's q: unused once the draft is cut
        drafts = np.asarray([[-1, 4]], np.int32)
        record = np.zeros((B, 6 + W), np.int32)
        hist = np.zeros((1, V), np.int32)
        pending = np.zeros(1, np.int32)
        spec_verify(logits, np.asarray([0], np.int32), np.asarray([7], np.int32),
                    np.asarray([5], np.int32), np.asarray([3], np.int32),
                    np.asarray([1], np.int32), np.asarray([[9, 1]], np.uint32),
                    np.asarray([temperature], np.float32), np.asarray([1.0], np.float32),
                    np.asarray([0], np.int32), np.asarray([0.0], np.float32),
                    np.zeros(1, np.float32), np.zeros(1, np.float32), np.ones(1, np.float32),
                    hist, np.zeros((B, 1), np.int32), np.zeros(1, np.int32), drafts, q,
                    np.arange(V, dtype=np.int32), np.asarray([0, 0, 0], np.int32), pending,
                    np.zeros(P, np.int32), record, B, P, V, V, 1, DMAX, W, 0)
        assert record[0, 1:4].tolist() == [3, 0, 1]  # 3 offers, nothing accepted
        token = int(record[0, 6])
        assert 0 <= token < V and record[0, 7:].tolist() == [-1, -1]
        if temperature == 0.0:
            assert token == best0
