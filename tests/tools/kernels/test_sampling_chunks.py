"""The chunked sampler's NumPy references: ``sample_chunks`` -> ``sample_merge`` ->
``sample_rest`` has exactly ``sample_biased``'s outputs (sampled ids and histogram
counts) on random rows: every truncation, penalties, bias, masks, ties, padding, and
vocabularies that end mid-chunk."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import grammar_mask_words, sample_biased
from helios_tools.kernels.sampling_chunks import (
    KEY_PAD,
    UNRESOLVED,
    key_value,
    order_key,
    sample_chunks,
    sample_merge,
    sample_rest,
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
