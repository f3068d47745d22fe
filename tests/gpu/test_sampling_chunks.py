"""The chunked sampler's three Triton kernels (``sample_chunks`` -> ``sample_merge`` ->
``sample_rest``) against the NumPy references on fresh random inputs with poisoned
outputs: each kernel's outputs against its own reference, and the composition against
``sample_biased``'s reference (the oracle: the same tokens and histogram counts), with
top-k / top-p / min-p / ties / masks / bias / seeds, and batch independence."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.sampling_chunks import CANDIDATES, CHUNK, UNRESOLVED

pytestmark = pytest.mark.gpu

ROW = ["slot", "positions", "sampling_decision", "seed", "temperature", "top_p", "top_k",
       "min_p", "presence", "frequency", "repetition"]


@pytest.fixture
def rng(request):
    """Inputs of their own per test: seeded from a stable hash of the test's name (Python's
    str hash is salted per process, so a failure could not be drawn again), or from
    HELIOS_TEST_SEED when set. The seed is printed (shown with a failure's captured setup
    output) and kept in the report's user_properties, so a device failure reproduces with
    ``HELIOS_TEST_SEED=<seed> pytest <that test>``."""
    env = os.environ.get("HELIOS_TEST_SEED")
    seed = int(env) if env else zlib.crc32(request.node.name.encode())
    print(f"rng seed {seed} (HELIOS_TEST_SEED={seed} reproduces {request.node.name})")
    request.node.user_properties.append(("rng_seed", seed))
    return np.random.default_rng(seed)


def _inputs(rng, R, V, S=16):
    logits = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    words = K.grammar_mask_words(V)
    hist = (rng.integers(0, 3, (S, V)) * (rng.random((S, V)) < 0.01)).astype(np.int32)
    p = dict(
        slot=rng.permutation(S)[:R].astype(np.int32),
        positions=rng.integers(0, 5000, R).astype(np.int32),
        sampling_decision=np.ones(R, np.int32),
        seed=rng.integers(0, 2**32, (R, 2), dtype=np.uint64).astype(np.uint32),
        temperature=np.full(R, 0.8, np.float32), top_p=np.full(R, 0.95, np.float32),
        top_k=np.full(R, 50, np.int32), min_p=np.zeros(R, np.float32),
        presence=np.zeros(R, np.float32), frequency=np.zeros(R, np.float32),
        repetition=np.ones(R, np.float32), histogram=hist,
        logit_bias=np.zeros((S, V), np.float32), use_bias=np.zeros(R, np.int32),
        grammar_mask=rng.integers(-2**31, 2**31, (R, words), dtype=np.int64).astype(np.int32),
        use_mask=np.zeros(R, np.int32))
    return logits, p


def _biased_args(p, hist):
    return [*(p[k] for k in ROW), hist, p["logit_bias"], p["use_bias"], p["grammar_mask"],
            p["use_mask"]]


def _reference(logits, p, R, V):
    hist = p["histogram"].copy()
    ref = np.zeros(R, np.int32)
    K.sample_biased(logits, *_biased_args(p, hist), ref, R, V, K.grammar_mask_words(V))
    return ref, hist


def _chunk_args(logits, p, hist):
    return [logits, p["slot"], p["temperature"], p["top_k"], p["presence"], p["frequency"],
            p["repetition"], hist, p["logit_bias"], p["use_bias"], p["grammar_mask"],
            p["use_mask"]]


def _run_chunked(gpu, logits, p, R, V, check_parts=True):
    """The three kernels in order on the GPU (each launch's outputs poisoned), each
    part's outputs checked against its reference; returns (sampled, histogram)."""
    words = K.grammar_mask_words(V)
    P, KM = -(-V // CHUNK), CANDIDATES
    shapes = [((R, P), np.float32), ((R, P), np.int32), ((R, P * KM), np.int32),
              ((R, P * KM), np.int32)]
    bufs = [np.zeros(s, d) for s, d in shapes]
    a = gpu.run("sample_chunks", *_chunk_args(logits, p, p["histogram"]), *bufs, R, V, words,
                CHUNK, KM)
    parts = [a["chunk_max"], a["chunk_arg"], a["cand_key"], a["cand_id"]]
    merge_rest = [p["slot"], p["positions"], p["sampling_decision"], p["seed"],
                  p["temperature"], p["top_p"], p["top_k"], p["min_p"]]
    b = gpu.run("sample_merge", *parts, *merge_rest, p["histogram"],
                np.zeros((R, 2 * KM), np.int32), np.zeros(R, np.int32), R, V, P, KM)
    if check_parts:
        ref = [np.full(s, np.nan if d == np.float32 else -7777, d) for s, d in shapes]
        K.sample_chunks(*_chunk_args(logits, p, p["histogram"]), *ref, R, V, words, CHUNK, KM)
        live = p["slot"] >= 0
        np.testing.assert_array_equal(a["chunk_max"][live], ref[0][live])
        np.testing.assert_array_equal(a["chunk_arg"][live], ref[1][live])
        cands = live & (p["temperature"] > 0) & (p["top_k"] > 0) & (p["top_k"] <= KM)
        np.testing.assert_array_equal(a["cand_key"][cands], ref[2][cands])
        np.testing.assert_array_equal(a["cand_id"][cands], ref[3][cands])
        hist_m = p["histogram"].copy()
        ref_sel, ref_out = np.zeros((R, 2 * KM), np.int32), np.zeros(R, np.int32)
        K.sample_merge(*ref, *merge_rest, hist_m, ref_sel, ref_out, R, V, P, KM)
        np.testing.assert_array_equal(b["sampled"], ref_out)
        np.testing.assert_array_equal(b["histogram"], hist_m)
    c = gpu.run("sample_rest", logits, *_biased_args(p, b["histogram"]), b["sampled"], R, V,
                words)
    assert not (c["sampled"] == UNRESOLVED).any()
    return c["sampled"], c["histogram"]


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_chunked_sampler_matches_sample_biased(gpu, rng, V):
    R, S = 12, 16
    logits, p = _inputs(rng, R, V, S)
    p["temperature"][0] = 0.0                                   # greedy
    p["top_k"][1], p["top_p"][1] = 40, 1.0                      # top-k only
    p["top_k"][2] = 0                                           # top-p only: sample_rest
    p["min_p"][3] = 0.05                                        # top-k + top-p + min-p
    p["presence"][4], p["frequency"][4], p["repetition"][4] = 0.5, 0.3, 1.3
    p["use_mask"][5] = 1                                        # grammar mask
    p["slot"][6] = -1                                           # padding
    p["sampling_decision"][7] = 0                               # do not count
    p["temperature"][8], p["top_k"][8] = 1.5, 1                 # top-1 == greedy
    p["top_k"][9] = 64                                          # the largest resolved k
    p["top_k"][10] = 65                                         # past it: sample_rest
    ids = rng.choice(V, 300, replace=False)                     # logit bias, both signs
    p["logit_bias"][p["slot"][11], ids] = rng.uniform(-100, 100, 300).astype(np.float32)
    p["use_bias"][11] = 1
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist = _run_chunked(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)


def test_chunked_sampler_ties_and_masked_rows(gpu, rng):
    R, V = 6, 49152
    logits, p = _inputs(rng, R, V)
    logits[:, 100:110] = 50.0                                   # ten-way tie at the top
    logits[:, 2047:2050] = 50.0                                 # a tie across a chunk edge
    logits[4] = np.round(logits[4])                             # ties everywhere
    p["temperature"][0] = 0.0                                   # greedy: lowest id
    p["top_k"][1] = 3                                           # tie broken by lower ids
    p["use_mask"][2] = 1
    p["grammar_mask"][2] = 0                                    # all masked -> token 0
    p["top_p"][3] = 0.25
    p["top_k"][4] = 17
    p["use_mask"][5] = 1                                        # four ids allowed
    p["grammar_mask"][5] = 0
    p["grammar_mask"][5, [0, 70, 900, 1535]] = 1
    p["grammar_mask"][5, 1535] = 1 << 7
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist = _run_chunked(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)


def test_chunked_sampler_seeded_and_batch_independent(gpu, rng):
    """Many seeds per row (fresh inputs each) give sample_biased's tokens; a row's token
    does not depend on its neighbours or its row index."""
    R, V = 64, 49152
    logits, p = _inputs(rng, R, V, S=R)  # a slot per row
    p["top_k"][:] = rng.choice([5, 20, 50, 64], R).astype(np.int32)
    p["top_p"][:] = rng.choice([1.0, 0.9, 0.95], R).astype(np.float32)
    p["temperature"][:] = rng.choice([0.5, 0.8, 1.2], R).astype(np.float32)
    ref, _ = _reference(logits, p, R, V)
    first, _ = _run_chunked(gpu, logits, p, R, V, check_parts=False)
    np.testing.assert_array_equal(first, ref)
    perm = rng.permutation(R)
    per_slot = ("histogram", "logit_bias")
    q = {k: (v[perm] if k not in per_slot else v) for k, v in p.items()}
    again, _ = _run_chunked(gpu, logits[perm], q, R, V, check_parts=False)
    np.testing.assert_array_equal(again, first[perm])
    one = {k: (v[3:4] if k not in per_slot else v) for k, v in p.items()}
    alone, _ = _run_chunked(gpu, logits[3:4], one, 1, V, check_parts=False)
    assert alone[0] == first[3]


# The nucleus form: sample_chunks_nucleus -> sample_merge_nucleus -> sample_rest, the
# sampler of cores exported since (top-p rows with no top-k resolved in the merge when
# their nucleus lies inside the NUCLEUS most probable candidates).


def _nucleus_chunk_args(logits, p, hist):
    return [logits, p["slot"], p["temperature"], p["top_p"], p["top_k"], p["presence"],
            p["frequency"], p["repetition"], hist, p["logit_bias"], p["use_bias"],
            p["grammar_mask"], p["use_mask"]]


def _run_nucleus(gpu, logits, p, R, V, check_parts=True):
    """The nucleus form's three kernels in order on the GPU (outputs poisoned), each
    part checked against its reference; returns (sampled, histogram, merged) where
    merged is what sample_merge_nucleus wrote (UNRESOLVED: left to sample_rest)."""
    from helios_tools.kernels.sampling_chunks import NUCLEUS, uses_nucleus

    words = K.grammar_mask_words(V)
    P, KM, KN = -(-V // CHUNK), CANDIDATES, NUCLEUS
    shapes = [((R, P), np.float32), ((R, P), np.int32), ((R, P), np.float32),
              ((R, P * KM), np.int32), ((R, P * KM), np.int32)]
    bufs = [np.zeros(s, d) for s, d in shapes]
    a = gpu.run("sample_chunks_nucleus", *_nucleus_chunk_args(logits, p, p["histogram"]),
                *bufs, R, V, words, CHUNK, KM)
    parts = [a["chunk_max"], a["chunk_arg"], a["chunk_mass"], a["cand_key"], a["cand_id"]]
    merge_rest = [p["slot"], p["positions"], p["sampling_decision"], p["seed"],
                  p["temperature"], p["top_p"], p["top_k"], p["min_p"]]
    b = gpu.run("sample_merge_nucleus", *parts, *merge_rest, p["histogram"],
                np.zeros((R, 2 * KN), np.int32), np.zeros(R, np.int32), R, V, P, CHUNK, KM,
                KN)
    if check_parts:
        ref = [np.full(s, np.nan if d == np.float32 else -7777, d) for s, d in shapes]
        K.sample_chunks_nucleus(*_nucleus_chunk_args(logits, p, p["histogram"]), *ref, R, V,
                                words, CHUNK, KM)
        live = p["slot"] >= 0
        np.testing.assert_array_equal(a["chunk_max"][live], ref[0][live])
        np.testing.assert_array_equal(a["chunk_arg"][live], ref[1][live])
        nucleus = live & np.array([uses_nucleus(float(p["temperature"][r]),
                                                float(p["top_p"][r]), int(p["top_k"][r]), V)
                                   for r in range(R)])
        cands = nucleus | (live & (p["temperature"] > 0) & (p["top_k"] > 0) &
                           (p["top_k"] <= KM))
        np.testing.assert_array_equal(a["cand_key"][cands], ref[3][cands])
        np.testing.assert_array_equal(a["cand_id"][cands], ref[4][cands])
        # each chunk's mass: exp and the sum's order are the device's (f32 rounding)
        np.testing.assert_allclose(a["chunk_mass"][nucleus], ref[2][nucleus], rtol=2e-5)
        hist_m = p["histogram"].copy()
        ref_out = np.zeros(R, np.int32)
        K.sample_merge_nucleus(*parts, *merge_rest, hist_m, np.zeros((R, 2 * KN), np.int32),
                               ref_out, R, V, P, CHUNK, KM, KN)
        np.testing.assert_array_equal(b["sampled"], ref_out)
        np.testing.assert_array_equal(b["histogram"], hist_m)
    c = gpu.run("sample_rest", logits, *_biased_args(p, b["histogram"]), b["sampled"], R, V,
                words)
    assert not (c["sampled"] == UNRESOLVED).any()
    return c["sampled"], c["histogram"], b["sampled"]


def _peak(rng, logits, rows, height=20.0):
    """LM-like rows: 30 ids far above the rest, so the nucleus is short."""
    V = logits.shape[1]
    for r in rows:
        head = rng.choice(V, 30, replace=False)
        logits[r, head] += np.float32(height) + rng.exponential(2.0, 30).astype(np.float32)


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_nucleus_sampler_matches_sample_biased(gpu, rng, V):
    R, S = 14, 16
    logits, p = _inputs(rng, R, V, S)
    p["top_k"][:] = 0                                           # top-p only (OpenAI)
    _peak(rng, logits, [1, 2, 3, 4, 5, 11, 12])
    p["temperature"][0] = 0.0                                   # greedy
    p["top_k"][2] = V                                           # top_k >= V: no top-k
    p["min_p"][3] = 0.05                                        # top-p + min-p
    p["presence"][4], p["frequency"][4], p["repetition"][4] = 0.5, 0.3, 1.3
    p["use_mask"][5] = 1                                        # grammar mask
    p["slot"][6] = -1                                           # padding
    p["sampling_decision"][7] = 0                               # not counted (flat row)
    p["top_k"][8] = 50                                          # top-k row
    p["top_k"][9] = 65                                          # past KM: sample_rest
    p["top_p"][10] = 1.0                                        # no truncation: rest
    ids = rng.choice(V, 300, replace=False)                     # logit bias, both signs
    p["logit_bias"][p["slot"][11], ids] = rng.uniform(-100, 100, 300).astype(np.float32)
    p["use_bias"][11] = 1
    p["top_p"][12], p["temperature"][12] = 0.5, 1.3
    logits[13] *= np.float32(0.05)                              # flat row: fallback
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, merged = _run_nucleus(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    assert (merged[[1, 2, 3, 4, 12]] >= 0).all()                # resolved in the merge
    assert (merged[[9, 10, 13]] == UNRESOLVED).all()            # the bisection drew these


def test_nucleus_fallback_at_the_candidate_bound(gpu, rng):
    """A nucleus ending on a probability equal to an id a chunk left out falls back; one
    ending one f32 step above it resolves in the merge; both give sample_biased's ids."""
    R, V = 4, 49152
    logits, p = _inputs(rng, R, V)
    logits[:] = -20.0
    logits[:, [3000, 9000, 30000]] = 10.0                       # the head, chunks 1, 4, 14
    logits[:, 10:10 + CANDIDATES - 1] = 8.5                     # chunk 0: KM - 1 at 8.5 ...
    logits[:, [9 + CANDIDATES, 10 + CANDIDATES]] = np.nextafter(np.float32(8.5),
                                                                np.float32(-np.inf))
    p["temperature"][:], p["top_k"][:] = 1.0, 0                 # ... its KM-th one step below
    e = np.exp(logits[0].astype(np.float64) - 10.0)
    q = e / e.sum()
    head = 3 * q[3000]
    p["top_p"][0] = head * 0.9                                  # inside the head
    p["top_p"][1] = head + 2.5 * q[10]                          # ends on an 8.5 id
    p["top_p"][2] = head + (CANDIDATES - 1) * q[10] + 0.5 * q[10 + CANDIDATES]  # on the bound
    p["top_p"][3] = 0.9999                                      # into the -20 tail
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, merged = _run_nucleus(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    assert merged[0] >= 0 and merged[1] >= 0
    assert merged[2] == UNRESOLVED and merged[3] == UNRESOLVED


def test_nucleus_sampler_seeded_and_batch_independent(gpu, rng):
    """Top-p-only rows (half resolved in the merge, half by the bisection) give
    sample_biased's tokens; a row's token does not depend on its neighbours or index."""
    R, V = 64, 49152
    logits, p = _inputs(rng, R, V, S=R)
    _peak(rng, logits, range(0, R, 2))
    p["top_k"][:] = 0
    p["top_p"][:] = rng.choice([0.8, 0.9, 0.95], R).astype(np.float32)
    p["temperature"][:] = rng.choice([0.5, 0.8, 1.2], R).astype(np.float32)
    ref, _ = _reference(logits, p, R, V)
    first, _, merged = _run_nucleus(gpu, logits, p, R, V, check_parts=False)
    np.testing.assert_array_equal(first, ref)
    assert (merged[0::2] >= 0).all()
    perm = rng.permutation(R)
    per_slot = ("histogram", "logit_bias")
    q = {k: (v[perm] if k not in per_slot else v) for k, v in p.items()}
    again, _, _ = _run_nucleus(gpu, logits[perm], q, R, V, check_parts=False)
    np.testing.assert_array_equal(again, first[perm])
    one = {k: (v[3:4] if k not in per_slot else v) for k, v in p.items()}
    alone, _, _ = _run_nucleus(gpu, logits[3:4], one, 1, V, check_parts=False)
    assert alone[0] == first[3]


# The wide form: sample_chunks_wide -> sample_merge_nucleus -> sample_race / sample_pick
# at levels 1 and 2 -> sample_rest, the sampler of cores exported since (every row with
# no top-k drawn over its chunks: top-p, temperature alone, min-p).


def _run_wide(gpu, logits, p, R, V, check_parts=True):
    """The wide form's kernels in order on the GPU (outputs poisoned), the chunk and race
    parts checked against their references; returns (sampled, histogram, after level 1,
    after level 2): ``sampled`` after each pick (UNRESOLVED: not yet drawn)."""
    from helios_tools.kernels.sampling_chunks import NUCLEUS, RACE_SLOTS, uses_wide

    words = K.grammar_mask_words(V)
    P, KM, KN, NB = -(-V // CHUNK), CANDIDATES, NUCLEUS, RACE_SLOTS
    shapes = [((R, P), np.float32), ((R, P), np.int32), ((R, P), np.float32),
              ((R, P * KM), np.int32), ((R, P * KM), np.int32)]
    a = gpu.run("sample_chunks_wide", *_nucleus_chunk_args(logits, p, p["histogram"]),
                *[np.zeros(s, d) for s, d in shapes], R, V, words, CHUNK, KM)
    parts = [a["chunk_max"], a["chunk_arg"], a["chunk_mass"], a["cand_key"], a["cand_id"]]
    live = p["slot"] >= 0
    wide = live & np.array([uses_wide(float(p["temperature"][r]), int(p["top_k"][r]), V)
                            for r in range(R)])
    if check_parts:
        ref = [np.full(s, np.nan if d == np.float32 else -7777, d) for s, d in shapes]
        K.sample_chunks_wide(*_nucleus_chunk_args(logits, p, p["histogram"]), *ref, R, V,
                             words, CHUNK, KM)
        np.testing.assert_array_equal(a["chunk_max"][live], ref[0][live])
        np.testing.assert_allclose(a["chunk_mass"][wide], ref[2][wide], rtol=2e-5)
    merge_rest = [p["slot"], p["positions"], p["sampling_decision"], p["seed"],
                  p["temperature"], p["top_p"], p["top_k"], p["min_p"]]
    b = gpu.run("sample_merge_nucleus", *parts, *merge_rest, p["histogram"],
                np.zeros((R, 2 * KN), np.int32), np.zeros(R, np.int32), R, V, P, CHUNK, KM,
                KN)
    sampled, hist = b["sampled"], b["histogram"]
    level = np.full((R, 2), -7, np.int32)
    after = []
    for lv in (1, 2):
        race_in = [logits, p["slot"], p["positions"], p["seed"], p["temperature"], p["top_k"],
                   p["min_p"], p["presence"], p["frequency"], p["repetition"], hist,
                   p["logit_bias"], p["use_bias"], p["grammar_mask"], p["use_mask"],
                   a["chunk_max"], a["chunk_mass"], sampled]
        outs = [np.full((R, P * NB), np.nan, np.float32),
                np.full((R, P * NB * 2), -7, np.int32), np.full((R, P * NB), -7, np.int32)]
        c = gpu.run("sample_race", *race_in, level, *outs, R, V, words, CHUNK, NB, lv)
        raced = wide & (sampled == UNRESOLVED) & ((c["race_level"][:, 1] >= 0) | (lv == 1))
        if check_parts:
            # The normalizer's f32 sum over the chunks runs in the device's order, so a
            # row's S (and with it p, the level's top pattern and an id on a slot edge)
            # may differ by an ulp: compare each row's totals and its best score, and the
            # level's top within a few f32 steps.
            rl = level.copy()
            ref = [np.full_like(o, np.nan if o.dtype == np.float32 else -7) for o in outs]
            K.sample_race(*race_in, rl, *ref, R, V, words, CHUNK, NB, lv)
            np.testing.assert_array_equal(c["race_level"][raced, 1], rl[raced, 1])
            assert (np.abs(c["race_level"][raced, 0] - rl[raced, 0]) <= 4).all()
            np.testing.assert_allclose(c["race_mass"][raced].sum(axis=1),
                                       ref[0][raced].sum(axis=1), rtol=1e-4)
            got_best = c["race_best"][raced].view(np.float64).max(axis=1)
            np.testing.assert_allclose(got_best, ref[1][raced].view(np.float64).max(axis=1),
                                       rtol=1e-6, atol=1e-6)
        level = c["race_level"]
        d = gpu.run("sample_pick", c["race_mass"], c["race_best"], c["race_arg"], p["slot"],
                    p["sampling_decision"], p["temperature"], p["top_p"], p["top_k"], hist,
                    level, sampled, R, V, P, NB, lv)
        sampled, hist, level = d["sampled"], d["histogram"], d["race_level"]
        after.append(sampled.copy())
    e = gpu.run("sample_rest", logits, *_biased_args(p, hist), sampled, R, V, words)
    assert not (e["sampled"] == UNRESOLVED).any()
    return e["sampled"], e["histogram"], after[0], after[1]


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_wide_sampler_matches_sample_biased(gpu, rng, V):
    R, S = 14, 16
    logits, p = _inputs(rng, R, V, S)
    p["top_k"][:] = 0                                           # top-p only (OpenAI)
    _peak(rng, logits, [1, 2, 3])
    p["temperature"][0] = 0.0                                   # greedy
    p["top_k"][2] = V                                           # top_k >= V: no top-k
    p["min_p"][3] = 0.05                                        # top-p + min-p
    p["presence"][4], p["frequency"][4], p["repetition"][4] = 0.5, 0.3, 1.3
    p["use_mask"][5] = 1                                        # grammar mask
    p["slot"][6] = -1                                           # padding
    p["sampling_decision"][7] = 0                               # not counted
    p["top_k"][8] = 50                                          # top-k row: the merge
    p["top_k"][9] = 65                                          # past KM: sample_rest
    p["top_p"][10] = 1.0                                        # temperature alone
    ids = rng.choice(V, 300, replace=False)                     # logit bias, both signs
    p["logit_bias"][p["slot"][11], ids] = rng.uniform(-100, 100, 300).astype(np.float32)
    p["use_bias"][11] = 1
    p["top_p"][12], p["min_p"][12] = 1.0, 0.1                   # min-p alone
    p["top_p"][13], p["temperature"][13] = 0.5, 1.3
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, one, two = _run_wide(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    assert (one[[10, 12]] >= 0).all()                           # no truncation: level 1
    assert two[9] == UNRESOLVED                                 # top_k 65: the bisection


def test_wide_sampler_flat_rows_and_ties(gpu, rng):
    """Flat rows (nuclei of thousands of ids) resolve in the race; a nucleus ending inside
    a tie class of hundreds of ids falls back when the race is won inside it; every token
    is sample_biased's."""
    R, V = 8, 49152
    logits, p = _inputs(rng, R, V)
    p["top_k"][:] = 0
    logits[:4] *= np.float32(0.3)                               # flat
    logits[4:] = np.round(logits[4:])                           # ties everywhere
    logits[6, :400] = 9.0                                       # a 400-way tie at the top
    p["top_p"][6] = 0.6
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, one, two = _run_wide(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    assert (two[:4] >= 0).all()


def test_wide_sampler_seeded_and_batch_independent(gpu, rng):
    R, V = 64, 49152
    logits, p = _inputs(rng, R, V, S=R)
    _peak(rng, logits, range(0, R, 2))
    logits[1::4] *= np.float32(0.2)
    p["top_k"][:] = 0
    p["top_p"][:] = rng.choice([0.8, 0.9, 0.95, 1.0], R).astype(np.float32)
    p["min_p"][:] = rng.choice([0.0, 0.0, 0.05], R).astype(np.float32)
    p["temperature"][:] = rng.choice([0.5, 0.8, 1.2], R).astype(np.float32)
    ref, _ = _reference(logits, p, R, V)
    first, _, _, two = _run_wide(gpu, logits, p, R, V, check_parts=False)
    np.testing.assert_array_equal(first, ref)
    perm = rng.permutation(R)
    per_slot = ("histogram", "logit_bias")
    q = {k: (v[perm] if k not in per_slot else v) for k, v in p.items()}
    again, _, _, _ = _run_wide(gpu, logits[perm], q, R, V, check_parts=False)
    np.testing.assert_array_equal(again, first[perm])
    one = {k: (v[3:4] if k not in per_slot else v) for k, v in p.items()}
    alone, _, _, _ = _run_wide(gpu, logits[3:4], one, 1, V, check_parts=False)
    assert alone[0] == first[3]


# The candidate race: sample_chunks_mass -> sample_merge -> sample_race_top ->
# sample_race_mass -> sample_race_pick (sample_biased's row for what no candidate
# decides), the sampler of cores exported since (every row with no top-k).


def _run_race(gpu, logits, p, R, V, check_parts=True, M=None):
    """The candidate race's kernels in order on the GPU (outputs poisoned), each part
    checked against its reference; returns (sampled, histogram, after the merge)."""
    from helios_tools.kernels.sampling_chunks import RACE_TOP, race_candidates, uses_wide

    M = M or RACE_TOP
    words = K.grammar_mask_words(V)
    P, KM = -(-V // CHUNK), CANDIDATES
    pen = [p["presence"], p["frequency"], p["repetition"], p["histogram"], p["logit_bias"],
           p["use_bias"], p["grammar_mask"], p["use_mask"]]
    shapes = [((R, P), np.float32), ((R, P), np.int32), ((R, P), np.float32),
              ((R, P * KM), np.int32), ((R, P * KM), np.int32)]
    head = [logits, p["slot"], p["temperature"], p["top_k"], *pen]
    a = gpu.run("sample_chunks_mass", *head, *[np.zeros(s, d) for s, d in shapes], R, V,
                words, CHUNK, KM)
    live = p["slot"] >= 0
    raced_rows = live & np.array([uses_wide(float(p["temperature"][r]), int(p["top_k"][r]),
                                            V) for r in range(R)])
    if check_parts:
        ref = [np.full(s, np.nan if d == np.float32 else -7777, d) for s, d in shapes]
        K.sample_chunks_mass(*head, *ref, R, V, words, CHUNK, KM)
        np.testing.assert_array_equal(a["chunk_max"][live], ref[0][live])
        np.testing.assert_array_equal(a["chunk_arg"][live], ref[1][live])
        np.testing.assert_allclose(a["chunk_mass"][raced_rows], ref[2][raced_rows],
                                   rtol=2e-5)
        cands = live & (p["temperature"] > 0) & (p["top_k"] > 0) & (p["top_k"] <= KM)
        np.testing.assert_array_equal(a["cand_key"][cands], ref[3][cands])
        np.testing.assert_array_equal(a["cand_id"][cands], ref[4][cands])
    merge_rest = [p["slot"], p["positions"], p["sampling_decision"], p["seed"],
                  p["temperature"], p["top_p"], p["top_k"], p["min_p"]]
    b = gpu.run("sample_merge", a["chunk_max"], a["chunk_arg"], a["cand_key"], a["cand_id"],
                *merge_rest, p["histogram"], np.zeros((R, 2 * KM), np.int32),
                np.zeros(R, np.int32), R, V, P, KM)
    merged, hist = b["sampled"], b["histogram"]
    pen[3] = hist
    raced = raced_rows & (merged == UNRESOLVED)
    top_in = [logits, p["slot"], p["positions"], p["seed"], p["temperature"], p["top_k"],
              p["min_p"], *pen, a["chunk_max"], a["chunk_mass"], merged]
    outs = [np.zeros((R, 2 * P * M), np.int32), np.zeros((R, P * M), np.int32),
            np.zeros((R, P * M), np.float32)]
    c = gpu.run("sample_race_top", *top_in, *outs, R, V, words, CHUNK, M)
    top = [c["top_score"], c["top_id"], c["top_zt"]]
    mass_in = [logits, p["slot"], p["temperature"], p["top_p"], p["top_k"], p["min_p"], *pen,
               a["chunk_max"], a["chunk_mass"], merged, *top]
    d = gpu.run("sample_race_mass", *mass_in, np.zeros((R, P * M), np.float32), R, V, words,
                CHUNK, M)
    if check_parts:
        # The normalizer's f32 sum over the chunks runs in the device's order, so a row's
        # p may differ by an ulp from the reference's: ids and order exactly, scores and
        # masses to f32 rounding.
        ref = [np.full_like(o, np.nan if o.dtype == np.float32 else -7) for o in outs]
        K.sample_race_top(*top_in, *ref, R, V, words, CHUNK, M)
        np.testing.assert_array_equal(c["top_id"][raced], ref[1][raced])
        np.testing.assert_allclose(c["top_score"][raced].view(np.float64),
                                   ref[0][raced].view(np.float64), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(c["top_zt"][raced], ref[2][raced])  # no S in zt
        massed = raced & (p["top_p"] < 1)
        ahead = np.full((R, P * M), np.nan, np.float32)
        K.sample_race_mass(*mass_in, ahead, R, V, words, CHUNK, M)
        np.testing.assert_allclose(d["ahead"][massed], ahead[massed], rtol=1e-4, atol=1e-7)
        for r in np.flatnonzero(raced):  # the row's candidates: the reference's, in order
            want = race_candidates(ref[0][r], ref[1][r], ref[2][r], P, M)[1]
            got = race_candidates(c["top_score"][r], c["top_id"][r], c["top_zt"][r], P,
                                  M)[1]
            np.testing.assert_array_equal(got, want)
    e = gpu.run("sample_race_pick", logits, *_biased_args(p, hist), *top, d["ahead"], merged,
                R, V, words, P, M)
    assert not (e["sampled"] == UNRESOLVED).any()
    return e["sampled"], e["histogram"], merged


@pytest.mark.parametrize("V", [5000, 49152, 128256])
def test_race_sampler_matches_sample_biased(gpu, rng, V):
    R, S = 14, 16
    logits, p = _inputs(rng, R, V, S)
    p["top_k"][:] = 0                                           # top-p only (OpenAI)
    _peak(rng, logits, [1, 2, 3])
    p["temperature"][0] = 0.0                                   # greedy
    p["top_k"][2] = V                                           # top_k >= V: no top-k
    p["min_p"][3] = 0.05                                        # top-p + min-p
    p["presence"][4], p["frequency"][4], p["repetition"][4] = 0.5, 0.3, 1.3
    p["use_mask"][5] = 1                                        # grammar mask
    p["slot"][6] = -1                                           # padding
    p["sampling_decision"][7] = 0                               # not counted
    p["top_k"][8] = 50                                          # top-k row: the merge
    p["top_k"][9] = 65                                          # past KM: the bisection
    p["top_p"][10] = 1.0                                        # temperature alone
    ids = rng.choice(V, 300, replace=False)                     # logit bias, both signs
    p["logit_bias"][p["slot"][11], ids] = rng.uniform(-100, 100, 300).astype(np.float32)
    p["use_bias"][11] = 1
    p["top_p"][12], p["min_p"][12] = 1.0, 0.1                   # min-p alone
    p["top_p"][13], p["temperature"][13] = 0.5, 1.3
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, merged = _run_race(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    assert merged[0] >= 0 and merged[8] >= 0 and merged[9] == UNRESOLVED


def test_race_sampler_flat_rows_ties_and_fallback(gpu, rng):
    """Flat rows (nuclei of thousands of ids), rows of tied logits, a nucleus ending inside
    a 400-way tie, and one candidate per chunk at top_p 0.1 (most rows fall back to the
    bisection in the pick): every token is sample_biased's."""
    R, V = 8, 49152
    logits, p = _inputs(rng, R, V)
    p["top_k"][:] = 0
    logits[:4] *= np.float32(0.3)                               # flat
    logits[4:] = np.round(logits[4:])                           # ties everywhere
    logits[6, :400] = 9.0                                       # a 400-way tie at the top
    p["top_p"][6] = 0.6
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, _ = _run_race(gpu, logits, p, R, V)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)
    p["top_p"][:] = 0.1
    ref, ref_hist = _reference(logits, p, R, V)
    got, hist, _ = _run_race(gpu, logits, p, R, V, M=1)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(hist, ref_hist)


def test_race_sampler_seeded_and_batch_independent(gpu, rng):
    R, V = 64, 49152
    logits, p = _inputs(rng, R, V, S=R)
    _peak(rng, logits, range(0, R, 2))
    logits[1::4] *= np.float32(0.2)
    p["top_k"][:] = 0
    p["top_p"][:] = rng.choice([0.8, 0.9, 0.95, 1.0], R).astype(np.float32)
    p["min_p"][:] = rng.choice([0.0, 0.0, 0.05], R).astype(np.float32)
    p["temperature"][:] = rng.choice([0.5, 0.8, 1.2], R).astype(np.float32)
    p["presence"][::3], p["frequency"][::3], p["repetition"][::3] = 0.5, 0.3, 1.1
    ref, _ = _reference(logits, p, R, V)
    first, _, _ = _run_race(gpu, logits, p, R, V, check_parts=False)
    np.testing.assert_array_equal(first, ref)
    again, _, _ = _run_race(gpu, logits, p, R, V, check_parts=False)
    np.testing.assert_array_equal(again, first)                 # same seeds: same tokens
    perm = rng.permutation(R)
    per_slot = ("histogram", "logit_bias")
    q = {k: (v[perm] if k not in per_slot else v) for k, v in p.items()}
    moved, _, _ = _run_race(gpu, logits[perm], q, R, V, check_parts=False)
    np.testing.assert_array_equal(moved, first[perm])
    one = {k: (v[3:4] if k not in per_slot else v) for k, v in p.items()}
    alone, _, _ = _run_race(gpu, logits[3:4], one, 1, V, check_parts=False)
    assert alone[0] == first[3]
