"""The sampler: logit bias, penalties, mask, truncations, the seeded race, histogram
bookkeeping; `sample` (cores exported before logit bias) is `sample_biased` unbiased."""

import math

import numpy as np
import pytest
from helios_tools.kernels import grammar_mask_words, philox4x32_10, sample, sample_biased
from helios_tools.kernels.sampling import _candidates, _penalize


class Batch:
    """Sampler inputs for R rows over V tokens; defaults: greedy, no penalties, no mask."""

    def __init__(self, logits, S=None):
        self.logits = np.asarray(logits, np.float32)
        R, V = self.logits.shape
        self.R, self.V, self.W32 = R, V, grammar_mask_words(V)
        S = S or R
        self.slot = np.arange(R, dtype=np.int32)
        self.positions = np.arange(R, dtype=np.int32) + 10
        self.sampling_decision = np.ones(R, np.int32)
        self.seed = np.tile(np.array([[0x1234, 0x5678]], np.uint32), (R, 1))
        self.temperature = np.zeros(R, np.float32)
        self.top_p = np.ones(R, np.float32)
        self.top_k = np.zeros(R, np.int32)
        self.min_p = np.zeros(R, np.float32)
        self.presence = np.zeros(R, np.float32)
        self.frequency = np.zeros(R, np.float32)
        self.repetition = np.ones(R, np.float32)
        self.histogram = np.zeros((S, V), np.int32)
        self.logit_bias = np.zeros((S, V), np.float32)
        self.use_bias = np.zeros(R, np.int32)
        self.grammar_mask = np.zeros((R, self.W32), np.int32)
        self.use_mask = np.zeros(R, np.int32)
        self.sampled = np.full(R, -99, np.int32)

    def run(self):
        sample_biased(
            self.logits, self.slot, self.positions, self.sampling_decision, self.seed,
            self.temperature, self.top_p, self.top_k, self.min_p, self.presence,
            self.frequency, self.repetition, self.histogram, self.logit_bias, self.use_bias,
            self.grammar_mask, self.use_mask, self.sampled, self.R, self.V, self.W32,
        )  # fmt: skip
        return self.sampled.tolist()

    def run_legacy(self):
        """The same inputs through `sample` (no logit bias)."""
        sample(
            self.logits, self.slot, self.positions, self.sampling_decision, self.seed,
            self.temperature, self.top_p, self.top_k, self.min_p, self.presence,
            self.frequency, self.repetition, self.histogram, self.grammar_mask, self.use_mask,
            self.sampled, self.R, self.V, self.W32,
        )  # fmt: skip
        return self.sampled.tolist()


def _bitmask(allowed_ids, V):
    words = np.zeros(grammar_mask_words(V), np.uint32)
    for i in allowed_ids:
        words[i // 32] |= np.uint32(1 << (i % 32))
    return words.view(np.int32)


def test_grammar_mask_words():
    assert [grammar_mask_words(v) for v in (1, 32, 33, 49152)] == [1, 1, 2, 1536]


def test_greedy_is_first_argmax():
    b = Batch([[0.0, 3.0, 1.0, 3.0], [5.0, -1.0, 5.0, 2.0]])
    assert b.run() == [1, 0]


def test_penalties_exact_values():
    z = np.array([2.0, -2.0, 1.0, 0.5, -1.0], np.float32)
    counts = np.array([3, 1, 0, 2, 0], np.int32)
    got = _penalize(z, counts, presence=0.25, frequency=0.5, repetition=2.0)
    # rep: 2/2=1, -2*2=-4, unseen 1, 0.5/2=0.25, unseen -1
    # freq 0.5*count: 1-1.5=-0.5, -4-0.5=-4.5, 1, 0.25-1=-0.75, -1
    # presence 0.25 where seen: -0.75, -4.75, 1, -1.0, -1
    assert got.tolist() == [-0.75, -4.75, 1.0, -1.0, -1.0]
    assert _penalize(z, counts, 0.0, 0.0, 1.0).tolist() == z.tolist()


def test_penalties_change_the_greedy_token_through_the_histogram_row():
    b = Batch([[2.0, 1.9, 0.0]], S=3)
    b.slot[:] = 2  # histogram is indexed by physical row, not submission row
    b.histogram[2, 0] = 1
    b.repetition[:] = 1.2  # 2.0 / 1.2 = 1.667 < 1.9
    assert b.run() == [1]
    b.repetition[:] = 1.0
    b.histogram[2] = 0
    b.histogram[0, 0] = 5  # another slot's counts do not matter
    assert b.run() == [0]


def test_grammar_mask_disallows_tokens():
    V = 70
    logits = np.linspace(0, 1, V, dtype=np.float32)[None, :].repeat(2, 0)
    b = Batch(logits)
    b.grammar_mask[0] = _bitmask([3, 40, 65], V)
    b.grammar_mask[1] = _bitmask([3], V)  # mask present but not used on row 1
    b.use_mask[:] = [1, 0]
    assert b.run() == [65, 69]
    b.temperature[:] = 1.0
    for pos in range(50):
        b.positions[:] = pos
        assert b.run()[0] in (3, 40, 65)


def test_top_k_keeps_exactly_k_with_low_index_ties():
    z = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.0], np.float32)
    cand, p = _candidates(z, 1.0, top_k=3, top_p=1.0, min_p=0.0)
    assert cand.tolist() == [1, 2, 3]
    e = np.exp(np.array([3.0, 2.0, 3.0]) - 3.0)
    np.testing.assert_allclose(p, e / e.sum(), rtol=1e-6)
    assert _candidates(z, 1.0, 1, 1.0, 0.0)[0].tolist() == [1]


def test_top_p_keeps_smallest_prefix_reaching_p():
    p = np.array([0.1, 0.4, 0.2, 0.3], np.float32)
    z = np.log(p)
    # sorted: 0.4 (1), 0.3 (3), 0.2 (2), 0.1 (0); cumulative 0.4, 0.7, 0.9, 1.0
    assert _candidates(z, 1.0, 0, 0.5, 0.0)[0].tolist() == [1, 3]
    assert _candidates(z, 1.0, 0, 0.65, 0.0)[0].tolist() == [1, 3]
    assert _candidates(z, 1.0, 0, 0.85, 0.0)[0].tolist() == [1, 2, 3]
    assert _candidates(z, 1.0, 0, 0.0, 0.0)[0].tolist() == [1]  # always at least one
    # ties in p are ordered by id: ids 0 and 2 tie, 0 comes first
    zt = np.log(np.array([0.3, 0.1, 0.3, 0.3], np.float32))
    assert _candidates(zt, 1.0, 0, 0.5, 0.0)[0].tolist() == [0, 2]


def test_min_p_and_temperature():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    assert _candidates(z, 1.0, 0, 1.0, 0.35)[0].tolist() == [0, 1]  # 0.15 < 0.175
    cand, p = _candidates(z, 0.5, 0, 1.0, 0.0)  # temperature 0.5 squares then renormalizes
    sq = np.array([0.25, 0.09, 0.0225, 0.0025])
    np.testing.assert_allclose(p, sq / sq.sum(), rtol=1e-5)


def test_truncated_sampling_draws_only_and_all_survivors():
    b = Batch(np.log(np.array([[0.05, 0.3, 0.1, 0.25, 0.3]], np.float32)))
    b.temperature[:] = 1.0
    b.top_k[:] = 4  # drops id 0
    b.top_p[:] = 0.8  # of the renormalized 4: keeps 1, 4, 3
    seen = set()
    for pos in range(300):
        b.positions[:] = pos
        seen.add(b.run()[0])
    assert seen == {1, 3, 4}


def _race_reference(logits, seed, position, temperature):
    """Independent: softmax in float64 and the scalar Philox word 0 of each token id."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    best, best_score = -1, -math.inf
    for i in range(len(p)):
        x0 = int(philox4x32_10([i, position, 0, 0], seed)[0])
        u = ((x0 >> 8) + 0.5) / 2**24
        score = math.log(p[i]) - math.log(-math.log(u))
        if score > best_score:
            best, best_score = i, score
    return best


def test_seeded_draw_is_the_philox_exponential_race():
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((6, 40)).astype(np.float32) * 2
    b = Batch(logits)
    b.temperature[:] = 0.8
    b.seed[:] = rng.integers(0, 2**32, size=(6, 2), dtype=np.uint32)
    got = b.run()
    for r in range(6):
        assert got[r] == _race_reference(logits[r], b.seed[r].tolist(), int(b.positions[r]), 0.8)


def test_seeded_row_is_independent_of_batch_neighbours_and_order():
    rng = np.random.default_rng(11)
    V = 500
    target = rng.standard_normal(V).astype(np.float32)
    lone = Batch(target[None, :])
    lone.temperature[:] = 1.0
    lone.seed[0] = [0xDEADBEEF, 0x0BADF00D]
    lone.positions[0] = 77
    tokens = {lone.run()[0]}
    for trial in range(3):
        b = Batch(rng.standard_normal((8, V)).astype(np.float32), S=8)
        row = trial * 3 + 1
        b.logits[row] = target
        b.temperature[:] = rng.uniform(0.5, 1.5, 8).astype(np.float32)
        b.temperature[row] = 1.0
        b.seed[:] = rng.integers(0, 2**32, size=(8, 2), dtype=np.uint32)
        b.seed[row] = [0xDEADBEEF, 0x0BADF00D]
        b.positions[:] = rng.integers(0, 1000, 8)
        b.positions[row] = 77
        b.slot[:] = rng.permutation(8)
        tokens.add(b.run()[row])
    assert len(tokens) == 1
    # and a different seed or position changes the draw for some of a few tries
    other = set()
    for pos in range(78, 90):
        lone.positions[0] = pos
        other.add(lone.run()[0])
    assert len(other) > 1


def test_histogram_counts_only_when_sampling_decision_and_padding_writes_nothing():
    b = Batch([[0.0, 5.0, 1.0], [4.0, 0.0, 1.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0]], S=5)
    b.slot[:] = [4, 0, -1, 2]
    b.sampling_decision[:] = [1, 0, 1, 1]
    b.histogram[:] = 1
    assert b.run() == [1, 0, -1, 0]
    expected = np.ones((5, 3), np.int32)
    expected[4, 1] = 2
    expected[2, 0] = 2
    assert b.histogram.tolist() == expected.tolist()


def test_all_masked_row_does_not_crash():
    b = Batch([[1.0, 2.0, 3.0]])
    b.use_mask[:] = 1  # every bit clear
    b.temperature[:] = 1.0
    assert b.run() == [0]


def test_race_frequencies_match_softmax_chi_square():
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    n = 4000
    b = Batch(np.log(probs).astype(np.float32)[None, :].repeat(n, 0))
    b.temperature[:] = 1.0
    b.positions[:] = np.arange(n)
    b.seed[:] = [0xC0FFEE, 0x5EED]
    counts = np.bincount(b.run(), minlength=4)
    expected = probs * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 3 degrees of freedom: P(chi2 > 25) ~ 1.6e-5; a biased race (e.g. using p instead of
    # log p, or ignoring temperature) lands in the hundreds.
    assert chi2 < 25, (counts, chi2)
    assert counts.min() > 0


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_reshapes_the_distribution(temperature):
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    n = 3000
    b = Batch(np.log(probs).astype(np.float32)[None, :].repeat(n, 0))
    b.temperature[:] = temperature
    b.positions[:] = np.arange(n)
    target = probs ** (1 / temperature)
    target /= target.sum()
    counts = np.bincount(b.run(), minlength=4)
    chi2 = float(((counts - target * n) ** 2 / (target * n)).sum())
    assert chi2 < 25, (counts, chi2)


def _top_p_reference(p, top_p):
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    total, kept = np.float32(0), []
    for i in order:
        kept.append(i)
        total = np.float32(total + p[i])
        if total >= top_p:
            break
    return sorted(kept)


@pytest.mark.parametrize("shape", ["peaked", "flat", "ties"])
def test_top_p_fast_path_equals_full_sort(shape):
    from helios_tools.kernels.sampling import _top_p

    rng = np.random.default_rng(3)
    V = 5000
    z = {
        "peaked": rng.standard_normal(V) * 4,
        "flat": rng.standard_normal(V) * 0.01,
        "ties": np.round(rng.standard_normal(V) * 3),  # many equal values at every cut
    }[shape]
    p = np.exp(z - z.max()).astype(np.float32)
    p /= p.sum(dtype=np.float32)
    for top_p in (0.1, 0.5, 0.9, 0.99):
        got = _top_p(p, np.float32(top_p)).tolist()
        assert got == _top_p_reference(p.tolist(), np.float32(top_p))


# ---- logit bias ----


def test_logit_bias_is_added_per_slot_before_the_greedy_choice():
    b = Batch([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0], [2.0, 1.0, 0.0]], S=4)
    b.slot[:] = [3, 0, 1]
    b.logit_bias[3] = [0.0, 1.5, 0.0]  # 1 + 1.5 > 2: slot 3's row picks id 1
    b.logit_bias[0] = [-100.0, 0.0, 0.0]  # OpenAI's "ban": id 0 cannot win
    b.logit_bias[1] = [0.0, 0.0, 5.0]  # use_bias is 0 on row 2: ignored
    b.use_bias[:] = [1, 1, 0]
    assert b.run() == [1, 1, 0]


def test_logit_bias_plus_100_forces_a_token_when_sampling():
    rng = np.random.default_rng(5)
    b = Batch(rng.standard_normal((1, 300)).astype(np.float32))
    b.temperature[:] = 1.0
    b.logit_bias[0, 123] = 100.0
    b.use_bias[:] = 1
    for pos in range(40):
        b.positions[:] = pos
        assert b.run() == [123]


def test_logit_bias_comes_before_the_repetition_penalty():
    # vLLM's order: bias, then penalties. z = 1.0 on a seen id, bias +1 -> 2.0, then
    # repetition 2 divides the positive logit -> 1.0 < 1.5. Penalty first would give
    # 1.0 / 2 + 1 = 1.5, a tie resolved to the lower id 0 instead.
    b = Batch([[1.0, 1.5]])
    b.histogram[0, 0] = 1
    b.sampling_decision[:] = 0  # keep the counts fixed across runs
    b.repetition[:] = 2.0
    b.logit_bias[0] = [1.0, 0.0]
    b.use_bias[:] = 1
    assert b.run() == [1]
    b.logit_bias[0] = [1.2, 0.0]  # (1 + 1.2) / 2 = 1.1: still below 1.5
    assert b.run() == [1]
    b.logit_bias[0] = [2.5, 0.0]  # (1 + 2.5) / 2 = 1.75 > 1.5
    assert b.run() == [0]


def test_legacy_sample_equals_sample_biased_without_bias():
    rng = np.random.default_rng(9)
    b = Batch(rng.standard_normal((6, 200)).astype(np.float32) * 2, S=6)
    b.temperature[:] = [0.0, 0.7, 1.0, 1.3, 0.9, 1.0]
    b.top_k[:] = [0, 0, 20, 0, 5, 0]
    b.top_p[:] = [1.0, 0.9, 1.0, 0.8, 1.0, 1.0]
    b.seed[:] = rng.integers(0, 2**32, size=(6, 2), dtype=np.uint32)
    b.logit_bias[:] = rng.standard_normal((6, 200)).astype(np.float32)  # unused: use_bias 0
    hist = b.histogram.copy()
    biased = b.run()
    b.histogram[:] = hist
    assert b.run_legacy() == biased
