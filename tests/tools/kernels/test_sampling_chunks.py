"""The chunked sampler's NumPy references: ``sample_chunks`` -> ``sample_merge`` ->
``sample_rest`` has exactly ``sample_biased``'s outputs (sampled ids and histogram
counts) on random rows: every truncation, penalties, bias, masks, ties, padding, and
vocabularies that end mid-chunk."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import grammar_mask_words, sample_biased
from helios_tools.kernels.sampling import row_logits
from helios_tools.kernels.sampling_chunks import (
    KEY_PAD,
    RACE_SLOTS,
    UNRESOLVED,
    key_value,
    order_key,
    race_candidates,
    race_slots,
    sample_chunks,
    sample_chunks_mass,
    sample_chunks_nucleus,
    sample_chunks_wide,
    sample_merge,
    sample_merge_nucleus,
    sample_pick,
    sample_race,
    sample_race_mass,
    sample_race_pick,
    sample_race_top,
    sample_rest,
    uses_nucleus,
)

C, KM = 256, 16  # small chunks so a few hundred ids span several


def _case(rng, R, V, S, ties):
    W = grammar_mask_words(V)
    logits = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    if ties:
        logits = np.round(logits).astype(np.float32)
    slot = rng.permutation(S)[:R].astype(np.int32)
    slot[rng.integers(R)] = -1
    hist = (rng.integers(0, 3, (S, V)) * (rng.random((S, V)) < 0.05)).astype(np.int32)
    return dict(
        logits=logits, slot=slot, positions=rng.integers(0, 500, R).astype(np.int32),
        sampling_decision=rng.integers(0, 2, R).astype(np.int32),
        seed=rng.integers(0, 2**32, (R, 2), dtype=np.uint64).astype(np.uint32),
        temperature=rng.choice([0.0, 0.7, 1.0, 1.3], R).astype(np.float32),
        top_p=rng.choice([1.0, 0.9, 0.5], R).astype(np.float32),
        top_k=rng.choice([0, 1, 5, KM, KM + 1, 50], R).astype(np.int32),
        min_p=rng.choice([0.0, 0.05], R).astype(np.float32),
        presence=rng.choice([0.0, 0.5], R).astype(np.float32),
        frequency=rng.choice([0.0, 0.2], R).astype(np.float32),
        repetition=rng.choice([1.0, 1.2], R).astype(np.float32), histogram=hist,
        logit_bias=(rng.standard_normal((S, V)) * 2).astype(np.float32),
        use_bias=rng.integers(0, 2, R).astype(np.int32),
        grammar_mask=rng.integers(-2**31, 2**31, (R, W), dtype=np.int64).astype(np.int32),
        use_mask=rng.integers(0, 2, R).astype(np.int32))


ROW = ["slot", "positions", "sampling_decision", "seed", "temperature", "top_p", "top_k",
       "min_p", "presence", "frequency", "repetition"]


def _biased(c, hist):
    return [c["logits"], *(c[k] for k in ROW), hist, c["logit_bias"], c["use_bias"],
            c["grammar_mask"], c["use_mask"]]


def _chunked(c, R, V):
    W, P = grammar_mask_words(V), -(-V // C)
    hist = c["histogram"].copy()
    cm, ca = np.full((R, P), np.nan, np.float32), np.full((R, P), -7, np.int32)
    ck, ci = np.full((R, P * KM), -7, np.int32), np.full((R, P * KM), -7, np.int32)
    sel, out = np.full((R, 2 * KM), -7, np.int32), np.full(R, -7, np.int32)
    sample_chunks(c["logits"], c["slot"], c["temperature"], c["top_k"], c["presence"],
                  c["frequency"], c["repetition"], hist, c["logit_bias"], c["use_bias"],
                  c["grammar_mask"], c["use_mask"], cm, ca, ck, ci, R, V, W, C, KM)
    sample_merge(cm, ca, ck, ci, c["slot"], c["positions"], c["sampling_decision"], c["seed"],
                 c["temperature"], c["top_p"], c["top_k"], c["min_p"], hist, sel, out, R, V,
                 P, KM)
    merged = out.copy()
    sample_rest(*_biased(c, hist), out, R, V, W)
    return out, hist, merged


@pytest.mark.parametrize("seed", range(12))
def test_chunked_composition_equals_sample_biased(seed):
    rng = np.random.default_rng(seed)
    R, S = 9, 12
    V = int(rng.choice([300, 1000, 4097]))  # 2, 4 and 17 chunks, the last partial
    c = _case(rng, R, V, S, ties=seed % 3 == 0)
    hist = c["histogram"].copy()
    ref = np.zeros(R, np.int32)
    sample_biased(*_biased(c, hist), ref, R, V, grammar_mask_words(V))
    got, got_hist, merged = _chunked(c, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got_hist, hist)
    # merge resolves greedy and top-k rows itself and leaves exactly the others
    live = c["slot"] >= 0
    rest = live & (c["temperature"] > 0) & ~((c["top_k"] > 0) & (c["top_k"] <= KM))
    fully_masked = np.array([not np.isfinite(_masked_max(c, r, V)) for r in range(R)])
    assert ((merged == UNRESOLVED) == (rest & ~fully_masked)).all()
    assert (merged[~live] == -1).all()


def _masked_max(c, r, V):
    if not c["use_mask"][r]:
        return 0.0
    words = c["grammar_mask"][r].view(np.uint32)
    bits = (words[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return 0.0 if bits.reshape(-1)[:V].any() else -np.inf


def test_chunk_candidates_are_each_chunks_top_k_in_id_order():
    rng = np.random.default_rng(7)
    R, V = 1, 600  # chunks of 256, 256 and 88 ids
    c = _case(rng, R, V, 2, ties=True)
    c.update(slot=np.array([0], np.int32), temperature=np.array([1.0], np.float32),
             top_k=np.array([5], np.int32), use_bias=np.zeros(1, np.int32),
             use_mask=np.zeros(1, np.int32), presence=np.zeros(1, np.float32),
             frequency=np.zeros(1, np.float32), repetition=np.ones(1, np.float32))
    P = 3
    cm, ca = np.zeros((1, P), np.float32), np.zeros((1, P), np.int32)
    ck, ci = np.zeros((1, P * KM), np.int32), np.zeros((1, P * KM), np.int32)
    sample_chunks(c["logits"], c["slot"], c["temperature"], c["top_k"], c["presence"],
                  c["frequency"], c["repetition"], c["histogram"], c["logit_bias"],
                  c["use_bias"], c["grammar_mask"], c["use_mask"], cm, ca, ck, ci, 1, V,
                  grammar_mask_words(V), C, KM)
    z = c["logits"][0]
    for p in range(P):
        part = z[p * C:(p + 1) * C]
        assert cm[0, p] == part.max() and ca[0, p] == p * C + int(np.argmax(part))
        order = np.lexsort((np.arange(part.size), -part))[:5]  # value desc, then lower id
        want = np.sort(order) + p * C
        np.testing.assert_array_equal(ci[0, p * KM:p * KM + 5], want)
        np.testing.assert_array_equal(key_value(ck[0, p * KM:p * KM + 5]), z[want])
        assert (ci[0, p * KM + 5:(p + 1) * KM] == -1).all()
        assert (ck[0, p * KM + 5:(p + 1) * KM] == KEY_PAD).all()


def test_order_keys_sort_like_floats_and_invert():
    x = np.array([-np.inf, -3.5, -0.0, 0.0, 1e-30, 2.0, np.inf], np.float32)
    k = order_key(x)
    assert (np.diff(k) >= 0).all() and k[1] < k[2] and k[4] < k[5]
    np.testing.assert_array_equal(key_value(k).view(np.int32), x.view(np.int32))
    assert (k > KEY_PAD).all()


# The nucleus form: sample_chunks_nucleus -> sample_merge_nucleus -> sample_rest.
KN = 24  # nucleus candidates kept by the merge (NUCLEUS at capture; small here)


def _nucleus(c, R, V):
    W, P = grammar_mask_words(V), -(-V // C)
    hist = c["histogram"].copy()
    cm, ca = np.full((R, P), np.nan, np.float32), np.full((R, P), -7, np.int32)
    cmass = np.full((R, P), np.nan, np.float32)
    ck, ci = np.full((R, P * KM), -7, np.int32), np.full((R, P * KM), -7, np.int32)
    sel, out = np.full((R, 2 * KN), -7, np.int32), np.full(R, -7, np.int32)
    sample_chunks_nucleus(c["logits"], c["slot"], c["temperature"], c["top_p"], c["top_k"],
                          c["presence"], c["frequency"], c["repetition"], hist,
                          c["logit_bias"], c["use_bias"], c["grammar_mask"], c["use_mask"],
                          cm, ca, cmass, ck, ci, R, V, W, C, KM)
    sample_merge_nucleus(cm, ca, cmass, ck, ci, c["slot"], c["positions"],
                         c["sampling_decision"], c["seed"], c["temperature"], c["top_p"],
                         c["top_k"], c["min_p"], hist, sel, out, R, V, P, C, KM, KN)
    merged = out.copy()
    sample_rest(*_biased(c, hist), out, R, V, W)
    return out, hist, merged


def _check_nucleus(c, R, V):
    """The nucleus composition has sample_biased's tokens and counts; returns what the
    merge left (UNRESOLVED or the token) per row."""
    hist = c["histogram"].copy()
    ref = np.zeros(R, np.int32)
    sample_biased(*_biased(c, hist), ref, R, V, grammar_mask_words(V))
    got, got_hist, merged = _nucleus(c, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got_hist, hist)
    return merged


def _peaked(rng, R, V, S, spread=6.0):
    """LM-like rows: a few dozen ids far above a long tail, so the nucleus is short."""
    c = _case(rng, R, V, S, ties=False)
    for r in range(R):
        head = rng.choice(V, 30, replace=False)
        c["logits"][r, head] += np.float32(spread) + rng.exponential(2.0, 30).astype(np.float32)
    return c


@pytest.mark.parametrize("seed", range(12))
def test_nucleus_composition_equals_sample_biased(seed):
    rng = np.random.default_rng(100 + seed)
    R, S = 12, 14
    V = int(rng.choice([300, 1000, 4097]))
    c = _peaked(rng, R, V, S) if seed % 2 else _case(rng, R, V, S, ties=seed % 3 == 0)
    c["top_k"] = rng.choice([0, 0, 0, V, V + 5, 5, KM + 1], R).astype(np.int32)
    c["top_p"] = rng.choice([0.95, 0.9, 0.5, 1.0], R).astype(np.float32)
    merged = _check_nucleus(c, R, V)
    live = c["slot"] >= 0
    nucleus = live & np.array([uses_nucleus(float(c["temperature"][r]), float(c["top_p"][r]),
                                            int(c["top_k"][r]), V) for r in range(R)])
    # Only nucleus rows may be resolved beyond sample_merge's own (greedy, top-k <= KM).
    other = live & ~nucleus & (c["temperature"] > 0) & ~((c["top_k"] > 0) &
                                                         (c["top_k"] <= KM))
    fully_masked = np.array([not np.isfinite(_masked_max(c, r, V)) for r in range(R)])
    assert not ((merged == UNRESOLVED) & ~(nucleus | other)).any()
    assert (merged[other & ~fully_masked] == UNRESOLVED).all()
    assert (merged[~live] == -1).all()


def _one_row(logits, top_p, temperature=1.0, min_p=0.0, top_k=0):
    V = logits.size
    W = grammar_mask_words(V)
    return dict(
        logits=logits[None].astype(np.float32), slot=np.array([0], np.int32),
        positions=np.array([17], np.int32), sampling_decision=np.ones(1, np.int32),
        seed=np.array([[12345, 678]], np.uint32),
        temperature=np.array([temperature], np.float32),
        top_p=np.array([top_p], np.float32), top_k=np.array([top_k], np.int32),
        min_p=np.array([min_p], np.float32), presence=np.zeros(1, np.float32),
        frequency=np.zeros(1, np.float32), repetition=np.ones(1, np.float32),
        histogram=np.zeros((1, V), np.int32), logit_bias=np.zeros((1, V), np.float32),
        use_bias=np.zeros(1, np.int32), grammar_mask=np.full((1, W), -1, np.int32),
        use_mask=np.zeros(1, np.int32))


def test_peaked_nuclei_resolve_in_the_merge_at_every_seed():
    rng = np.random.default_rng(5)
    R, V = 10, 4097
    resolved = 0
    for _ in range(6):
        c = _peaked(rng, R, V, R, spread=12.0)
        c.update(slot=np.arange(R, dtype=np.int32), temperature=np.full(R, 0.8, np.float32),
                 top_p=np.full(R, 0.95, np.float32), top_k=np.zeros(R, np.int32),
                 use_mask=np.zeros(R, np.int32))
        merged = _check_nucleus(c, R, V)
        resolved += int((merged >= 0).sum())
    assert resolved == 6 * R  # a 30-id head: every nucleus is inside the candidates


def test_flat_rows_fall_back_to_the_bisection():
    rng = np.random.default_rng(6)
    R, V = 8, 4097
    c = _case(rng, R, V, R, ties=False)
    c.update(slot=np.arange(R, dtype=np.int32), temperature=np.full(R, 1.0, np.float32),
             top_p=np.full(R, 0.95, np.float32), top_k=np.zeros(R, np.int32),
             logits=(rng.standard_normal((R, V)) * 0.1).astype(np.float32))
    merged = _check_nucleus(c, R, V)
    assert (merged == UNRESOLVED).all()  # thousands of ids in each nucleus


def test_nucleus_ending_on_the_bound_falls_back_and_just_above_it_resolves():
    V = 1000  # chunks 0..3 of 256, 256, 256, 232 ids
    z = np.full(V, -20.0, np.float32)
    z[[300, 600, 800]] = 10.0         # the head, in chunks 1, 2 and 3
    z[10:10 + KM + 1] = 8.0           # KM + 1 ids of 8.0 in chunk 0: its KM-th key is 8.0
    p = np.exp(z - 10.0)
    p /= p.sum()
    head = np.float32(3 * p[300])
    # top_p inside the head: the nucleus ends at 10.0, strictly above the bound 8.0
    c = _one_row(z, float(head) * 0.99)
    assert _check_nucleus(c, 1, V)[0] >= 0
    # top_p past the head: the nucleus ends on an 8.0 id, equal to the id chunk 0 left
    # out (id 10 + KM): not provably inside, so the bisection draws it
    c = _one_row(z, float(head + 2 * p[10]))
    assert _check_nucleus(c, 1, V)[0] == UNRESOLVED
    # chunk 0: KM - 1 ids of 8.5, then two one f32 step below (its KM-th key and the id
    # it leaves out): a nucleus ending on an 8.5 id is strictly above the bound
    # (resolved); one that needs a lower id ends on the bound (the bisection)
    z2 = z.copy()
    z2[10:10 + KM - 1] = 8.5
    z2[[9 + KM, 10 + KM]] = np.nextafter(np.float32(8.5), np.float32(-np.inf))
    p2 = np.exp(z2 - 10.0)
    p2 /= p2.sum()
    head2 = float(3 * p2[300])
    assert p2[10] > p2[10 + KM]  # distinct probabilities one step apart
    assert _check_nucleus(_one_row(z2, head2 + 2.5 * float(p2[10])), 1, V)[0] >= 0
    edge = head2 + (KM - 1) * float(p2[10]) + 0.5 * float(p2[10 + KM])
    assert _check_nucleus(_one_row(z2, edge), 1, V)[0] == UNRESOLVED


def test_nucleus_past_the_merged_candidates_falls_back():
    V = 4097
    z = np.full(V, -30.0, np.float32)
    z[np.arange(0, 17 * 200, 100)] = 5.0  # 34 equal ids, one or two per chunk: > KN
    merged = _check_nucleus(_one_row(z, 0.9), 1, V)
    assert merged[0] == UNRESOLVED  # the nucleus needs ids the merge's KN left out
    merged = _check_nucleus(_one_row(z, 0.5), 1, V)
    assert merged[0] == UNRESOLVED  # ties across the KN boundary: not strictly above
    z[5] = 9.0
    merged = _check_nucleus(_one_row(z, 0.5), 1, V)
    assert merged[0] == 5  # one id holds the nucleus


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99999])
def test_whole_row_candidates_need_no_bound(top_p):
    V = KM - 3  # one chunk, every id a candidate
    rng = np.random.default_rng(int(top_p * 1000))
    z = (rng.standard_normal(V) * 2).astype(np.float32)
    assert _check_nucleus(_one_row(z, top_p, temperature=0.7), 1, V)[0] >= 0


def test_nucleus_ties_min_p_and_masks():
    V = 1000
    z = np.full(V, -5.0, np.float32)
    z[[40, 41, 260, 600, 601, 602]] = 7.0  # six-way tie at the top, across chunks
    for top_p in (0.2, 0.5, 0.8):
        assert _check_nucleus(_one_row(z, top_p), 1, V)[0] in (40, 41, 260, 600, 601, 602)
    c = _one_row(z, 0.95, min_p=0.5)
    assert _check_nucleus(c, 1, V)[0] >= 0
    c = _one_row(z, 0.95)
    c["use_mask"][0] = 1
    c["grammar_mask"][0] = 0
    c["grammar_mask"][0, 600 // 32] = 1 << (600 % 32)
    c["grammar_mask"][0, 3] = -1      # ids 96..127 allowed too, at -5.0
    assert _check_nucleus(c, 1, V)[0] in (600, *range(96, 128))
    c["grammar_mask"][0] = 0          # every id masked: token 0, as sample_biased
    assert _check_nucleus(c, 1, V)[0] == 0


# The wide form: sample_chunks_wide -> sample_merge_nucleus -> (sample_race ->
# sample_pick) at levels 1 and 2 -> sample_rest; rows with no top-k are drawn over their
# chunks, top-p or not.
NB = RACE_SLOTS


def _wide(c, R, V, nb=NB):
    """The wide form's references in order; returns (sampled, histogram, after level 1,
    after level 2) where the last two are ``sampled`` after each pick."""
    W = grammar_mask_words(V)
    P = -(-V // C)
    hist = c["histogram"].copy()
    cm, ca, cmass = np.zeros((R, P), np.float32), np.zeros((R, P), np.int32), \
        np.zeros((R, P), np.float32)
    ck, ci = np.zeros((R, P * KM), np.int32), np.zeros((R, P * KM), np.int32)
    sample_chunks_wide(c["logits"], c["slot"], c["temperature"], c["top_p"], c["top_k"],
                       c["presence"], c["frequency"], c["repetition"], hist, c["logit_bias"],
                       c["use_bias"], c["grammar_mask"], c["use_mask"], cm, ca, cmass, ck, ci,
                       R, V, W, C, KM)
    out = np.zeros(R, np.int32)
    sample_merge_nucleus(cm, ca, cmass, ck, ci, c["slot"], c["positions"],
                         c["sampling_decision"], c["seed"], c["temperature"], c["top_p"],
                         c["top_k"], c["min_p"], hist, np.zeros((R, 2 * 256), np.int32), out,
                         R, V, P, C, KM, 256)
    level = np.full((R, 2), -7, np.int32)
    after = []
    for lv in (1, 2):
        mass = np.full((R, P * nb), np.nan, np.float32)
        best = np.full((R, P * nb * 2), -7, np.int32)
        arg = np.full((R, P * nb), -7, np.int32)
        sample_race(c["logits"], c["slot"], c["positions"], c["seed"], c["temperature"],
                    c["top_k"], c["min_p"], c["presence"], c["frequency"], c["repetition"],
                    hist, c["logit_bias"], c["use_bias"], c["grammar_mask"], c["use_mask"],
                    cm, cmass, out, level, mass, best, arg, R, V, W, C, nb, lv)
        sample_pick(mass, best, arg, c["slot"], c["sampling_decision"], c["temperature"],
                    c["top_p"], c["top_k"], hist, level, out, R, V, P, nb, lv)
        after.append(out.copy())
    sample_rest(*_biased(c, hist), out, R, V, W)
    return out, hist, after[0], after[1]


def _check_wide(c, R, V):
    ref, ref_hist = np.zeros(R, np.int32), c["histogram"].copy()
    sample_biased(*_biased(c, ref_hist), ref, R, V, grammar_mask_words(V))
    got, hist, one, two = _wide(c, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    return one, two


@pytest.mark.parametrize("seed", range(6))
def test_wide_composition_equals_sample_biased(seed):
    rng = np.random.default_rng(100 + seed)
    R, V = 12, 1000
    c = _case(rng, R, V, 16, ties=seed % 2 == 1)
    c["top_k"][: R // 2] = 0  # half the rows with no top-k
    one, two = _check_wide(c, R, V)
    live = c["slot"] >= 0
    wide = live & (c["temperature"] > 0) & (c["top_k"] == 0)
    # no wide row is left for the second level's pick without being raced by the first
    assert not ((one == UNRESOLVED) & wide & (c["top_p"] >= 1)).any()


def test_flat_rows_resolve_over_their_chunks():
    """Flat rows (nuclei of thousands of ids: the merge falls back on every one) resolve
    in the race at level 1 or 2 at every seed, with sample_biased's tokens."""
    rng = np.random.default_rng(7)
    R, V = 8, 4097
    left = 0
    for _ in range(4):
        c = _case(rng, R, V, R, ties=False)
        c.update(slot=np.arange(R, dtype=np.int32), temperature=np.full(R, 0.8, np.float32),
                 top_p=np.full(R, 0.95, np.float32), top_k=np.zeros(R, np.int32),
                 min_p=np.zeros(R, np.float32), use_mask=np.zeros(R, np.int32),
                 logits=(rng.standard_normal((R, V)) * 1.5).astype(np.float32))
        one, two = _check_wide(c, R, V)
        left += int((two == UNRESOLVED).sum())
    assert left == 0


def test_temperature_and_min_p_rows_resolve_at_level_one():
    rng = np.random.default_rng(8)
    R, V = 8, 4097
    c = _case(rng, R, V, R, ties=True)
    c.update(slot=np.arange(R, dtype=np.int32), temperature=np.full(R, 1.1, np.float32),
             top_p=np.ones(R, np.float32), top_k=np.zeros(R, np.int32))
    c["min_p"][:4] = 0.1
    one, _ = _check_wide(c, R, V)
    assert (one >= 0).all()  # no truncation to locate: the race over every kept id


def test_a_nucleus_ending_in_a_tie_class_resolves_or_falls_back_exactly():
    """Hundreds of ids tied at the nucleus's end: the slots cannot split a tie class, so a
    row whose race is won inside it falls back; either way sample_biased's token."""
    V = 4097
    z = np.zeros(V, np.float32)
    z[:50] = 3.0
    for s in range(12):
        c = _one_row(z, 0.6)
        c["seed"][0] = (s, 99)
        _check_wide(c, 1, V)


def test_race_slots_are_monotone_and_share_ties():
    p = np.sort(np.random.default_rng(9).random(5000).astype(np.float32))[::-1]
    p = np.concatenate([p, p[:10], np.zeros(3, np.float32)])
    hi = int(np.float32(0.5).view(np.int32))
    j = race_slots(p, hi, 13, NB)
    order = np.argsort(-p, kind="stable")
    assert (np.diff(j[order]) >= 0).all()
    assert j[p > 0.5].max() == 0 and j[p == 0].min() == NB - 1
    for v in p[:10]:
        assert len(set(j[p == v])) == 1


# The candidate race: sample_chunks_mass -> sample_merge -> sample_race_top ->
# sample_race_mass -> sample_race_pick (its sample_biased fallback included).


def _race(c, R, V, M=4, parts=None):
    """The candidate race's references in order (outputs poisoned); returns (sampled,
    histogram, after the merge, which rows ran sample_biased's row in the pick); `parts`,
    a dict, receives the race's top_score, top_id, top_zt and ahead."""
    W, P = grammar_mask_words(V), -(-V // C)
    hist = c["histogram"].copy()
    cm, ca = np.full((R, P), np.nan, np.float32), np.full((R, P), -7, np.int32)
    cmass = np.full((R, P), np.nan, np.float32)
    ck, ci = np.full((R, P * KM), -7, np.int32), np.full((R, P * KM), -7, np.int32)
    pen = [c["presence"], c["frequency"], c["repetition"], hist, c["logit_bias"],
           c["use_bias"], c["grammar_mask"], c["use_mask"]]
    sample_chunks_mass(c["logits"], c["slot"], c["temperature"], c["top_k"], *pen, cm, ca,
                       cmass, ck, ci, R, V, W, C, KM)
    out = np.full(R, -7, np.int32)
    sample_merge(cm, ca, ck, ci, c["slot"], c["positions"], c["sampling_decision"], c["seed"],
                 c["temperature"], c["top_p"], c["top_k"], c["min_p"], hist,
                 np.zeros((R, 2 * KM), np.int32), out, R, V, P, KM)
    merged = out.copy()
    ts = np.full((R, 2 * P * M), -7, np.int32)
    tid = np.full((R, P * M), -7, np.int32)
    tpr = np.full((R, P * M), np.nan, np.float32)
    sample_race_top(c["logits"], c["slot"], c["positions"], c["seed"], c["temperature"],
                    c["top_k"], c["min_p"], *pen, cm, cmass, out, ts, tid, tpr, R, V, W, C, M)
    ahead = np.full((R, P * M), np.nan, np.float32)
    sample_race_mass(c["logits"], c["slot"], c["temperature"], c["top_p"], c["top_k"],
                     c["min_p"], *pen, cm, cmass, out, ts, tid, tpr, ahead, R, V, W, C, M)
    fallback = np.zeros(R, bool)
    for r in range(R):  # which unresolved rows no candidate decides (the pick's bisection)
        if out[r] != UNRESOLVED:
            continue
        fallback[r] = True
        if c["temperature"][r] > 0 and not 0 < c["top_k"][r] < V:
            score, _, _ = race_candidates(ts[r], tid[r], tpr[r], P, M)
            if c["top_p"][r] >= 1:
                fallback[r] = not np.isfinite(score[0])
            else:
                before = ahead[r].reshape(P, M).sum(axis=0, dtype=np.float32)
                ok = np.isfinite(score) & ((before < c["top_p"][r]) | (before == 0))
                fallback[r] = not ok.any()
    if parts is not None:
        parts.update(top_score=ts, top_id=tid, top_zt=tpr, ahead=ahead)
    sample_race_pick(*_biased(c, hist), ts, tid, tpr, ahead, out, R, V, W, P, M)
    return out, hist, merged, fallback


def _check_race(c, R, V, M=4):
    ref, ref_hist = np.zeros(R, np.int32), c["histogram"].copy()
    sample_biased(*_biased(c, ref_hist), ref, R, V, grammar_mask_words(V))
    got, hist, merged, fallback = _race(c, R, V, M)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    return merged, fallback


@pytest.mark.parametrize("seed", range(8))
def test_race_composition_equals_sample_biased(seed):
    """Every truncation, penalties, bias, masks, ties, padding, vocabularies that end
    mid-chunk: the candidate race's tokens and counts are sample_biased's."""
    rng = np.random.default_rng(300 + seed)
    R = 12
    V = int(rng.choice([300, 1000, 4097]))
    c = _case(rng, R, V, 16, ties=seed % 2 == 1)
    c["top_k"][: R // 2] = 0
    c["top_k"][R // 2] = V  # top_k >= V: no top-k
    merged, _ = _check_race(c, R, V, M=int(rng.choice([1, 2, 4, 8])))
    live = c["slot"] >= 0
    raced = live & (c["temperature"] > 0) & ((c["top_k"] <= 0) | (c["top_k"] >= V))
    masked = np.array([not np.isfinite(_masked_max(c, r, V)) for r in range(R)])
    assert (merged[raced & ~masked] == UNRESOLVED).all()  # the merge leaves them to the race


def _flat(rng, R, V, top_p, scale=1.5):
    c = _case(rng, R, V, R, ties=False)
    c.update(slot=np.arange(R, dtype=np.int32), temperature=np.full(R, 0.8, np.float32),
             top_p=np.full(R, top_p, np.float32), top_k=np.zeros(R, np.int32),
             min_p=np.zeros(R, np.float32), use_mask=np.zeros(R, np.int32),
             logits=(rng.standard_normal((R, V)) * scale).astype(np.float32))
    return c


def test_flat_rows_resolve_from_the_candidates():
    """Flat rows (nuclei of thousands of ids) are drawn from the race's candidates at
    top_p 0.95 and 0.8 without the bisection at these seeds, sample_biased's tokens."""
    rng = np.random.default_rng(17)
    R, V = 16, 4097
    for tp in (0.95, 0.8):
        _, fallback = _check_race(_flat(rng, R, V, tp), R, V)
        assert not fallback.any()


def test_candidates_outside_the_nucleus_fall_back_exactly():
    """A small top_p on flat rows: with one candidate per chunk most rows' best race
    score lies outside the nucleus and the pick runs sample_biased's row; the tokens are
    sample_biased's either way."""
    rng = np.random.default_rng(18)
    R, V = 12, 1000
    _, fallback = _check_race(_flat(rng, R, V, 0.1), R, V, M=1)
    assert fallback.sum() >= R // 2


def test_temperature_and_min_p_rows_need_no_mass():
    """No top-p: the race's best candidate is the token (min-p already in its scores)."""
    rng = np.random.default_rng(19)
    R, V = 8, 4097
    c = _case(rng, R, V, R, ties=True)
    c.update(slot=np.arange(R, dtype=np.int32), temperature=np.full(R, 1.1, np.float32),
             top_p=np.ones(R, np.float32), top_k=np.zeros(R, np.int32))
    c["min_p"][:4] = 0.1
    _, fallback = _check_race(c, R, V)
    assert not fallback.any()


def test_race_nucleus_ending_in_a_tie_class():
    """Fifty ids tied at the top and a nucleus ending inside the tie class: the mass
    ahead of a tied candidate counts the tied lower ids, as sample_biased's order."""
    V = 4097
    z = np.zeros(V, np.float32)
    z[:50] = 3.0
    for s in range(12):
        c = _one_row(z, 0.6)
        c["seed"][0] = (s, 99)
        _check_race(c, 1, V)


def test_race_equals_sample_biased_up_to_the_f32_order_of_the_mass_sums():
    """The documented tolerance, pinned: the race sums a candidate's mass ahead per chunk
    and then over the chunks, sample_biased by one sequential f32 cumsum over the sorted
    row; on a flat row of 49,152 ids the two sums differ in the sixth digit. A top_p
    strictly between them puts the race's best candidate inside one nucleus and outside the
    other, so the two tokens differ, and here the race's side is the exact one (the f64 sum
    of the same f32 probabilities). Any top_p not between them gives the same token."""
    rng = np.random.default_rng(21)
    R, V, M = 1, 49152, 4
    c = _flat(rng, R, V, 0.95, scale=0.9)
    parts: dict = {}
    _race(c, R, V, M, parts)
    P = -(-V // C)
    _, cid, _ = race_candidates(parts["top_score"][0], parts["top_id"][0],
                                parts["top_zt"][0], P, M)
    race_sum = parts["ahead"][0].reshape(P, M)[:, 0].sum(dtype=np.float32)
    z = row_logits(c["logits"], c["slot"], c["presence"], c["frequency"], c["repetition"],
                   c["histogram"], c["logit_bias"], c["use_bias"], c["grammar_mask"],
                   c["use_mask"], 0, V, grammar_mask_words(V)) / np.float32(0.8)
    e = np.exp(z - z.max())
    p = e / e.sum(dtype=np.float32)                      # sample_biased's probabilities
    order = np.argsort(-p, kind="stable")
    ref_ahead = np.empty(V, np.float32)
    ref_ahead[order] = np.concatenate([[np.float32(0)], np.cumsum(p[order],
                                                                  dtype=np.float32)[:-1]])
    ref_sum = ref_ahead[cid[0]]
    exact = p[order[:np.flatnonzero(order == cid[0])[0]]].astype(np.float64).sum()
    lo, hi = sorted((float(race_sum), float(ref_sum)))
    assert hi - lo > 1e-7                                # the two orders' sums differ
    tp = np.float32((lo + hi) / 2)
    assert lo < tp < hi
    c["top_p"][0] = tp
    ref = np.zeros(R, np.int32)
    sample_biased(*_biased(c, c["histogram"].copy()), ref, R, V, grammar_mask_words(V))
    got = _race(c, R, V, M)[0]
    assert (got[0] == cid[0]) == (race_sum < tp) and (ref[0] == cid[0]) == (ref_sum < tp)
    assert got[0] != ref[0]
    assert (exact < tp) == (race_sum < tp)               # the race's side is the exact one
    for off in (np.float32(lo) - np.float32(1e-6), np.float32(hi) + np.float32(1e-6)):
        c["top_p"][0] = off                              # outside the interval: one token
        _check_race(c, R, V, M)


def test_race_candidates_are_the_rows_best_scores_ties_to_lower_ids():
    P, M = 3, 2
    score = np.array([5.0, 1.0, 5.0, -np.inf, 7.0, 5.0])
    ids = np.array([10, 11, 4, 2**31 - 1, 30, 2], np.int32)
    prob = np.arange(6, dtype=np.float32)
    s, i, p = race_candidates(score.view(np.int32), ids, prob, P, M)
    assert s.tolist() == [7.0, 5.0] and i.tolist() == [30, 2] and p.tolist() == [4.0, 5.0]
