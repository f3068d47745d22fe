"""token_logprobs: log_softmax of the raw logits, the sampled token and the top k."""

import numpy as np
import pytest
from helios_tools.kernels import token_logprobs

K = 5
POISON = -7777


def _run(logits, sampled, k, slot=None):
    logits = np.asarray(logits, np.float32)
    R, V = logits.shape
    slot = np.arange(R, dtype=np.int32) if slot is None else np.asarray(slot, np.int32)
    logprobs = np.full((R, 1 + K), np.nan, np.float32)
    top_ids = np.full((R, K), POISON, np.int32)
    token_logprobs(logits, slot, np.asarray(sampled, np.int32), np.asarray(k, np.int32),
                   logprobs, top_ids, R, V, K)
    return logprobs, top_ids


def _independent_log_softmax(z):
    """float64 log_softmax without the max shift (values here are small)."""
    z = np.asarray(z, np.float64)
    return z - np.log(np.exp(z).sum())


def test_sampled_token_and_top_k_are_the_log_softmax():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 1000)).astype(np.float32) * 3
    sampled = [17, 999, 0]
    lp, ids = _run(logits, sampled, [K, 3, 0])
    for r in range(3):
        ref = _independent_log_softmax(logits[r])
        np.testing.assert_allclose(lp[r, 0], ref[sampled[r]], rtol=0, atol=1e-6)
        k = [K, 3, 0][r]
        want = np.argsort(-ref, kind="stable")[:k]
        assert ids[r, :k].tolist() == want.tolist()
        np.testing.assert_allclose(lp[r, 1:1 + k], ref[want], rtol=0, atol=1e-6)
        # entries past k are not written
        assert np.isnan(lp[r, 1 + k:]).all() and (ids[r, k:] == POISON).all()
    # probabilities of the whole row sum to one (the normalizer is right)
    assert abs(np.exp(_independent_log_softmax(logits[0])).sum() - 1) < 1e-12


def test_ties_order_lower_ids_first_and_the_sampled_token_need_not_be_on_top():
    z = np.zeros((1, 10), np.float32)
    z[0, [7, 2, 5]] = 4.0  # three-way tie at the top
    z[0, 9] = 3.0
    lp, ids = _run(z, [0], [4])
    assert ids[0, :4].tolist() == [2, 5, 7, 9]
    ref = _independent_log_softmax(z[0])
    np.testing.assert_allclose(lp[0], [ref[0], ref[2], ref[5], ref[7], ref[9], np.nan],
                               atol=1e-6)


def test_rows_that_ask_nothing_and_padding_rows_write_nothing():
    logits = np.ones((3, 8), np.float32)
    lp, ids = _run(logits, [1, 2, 3], [-1, 2, 2], slot=[0, 1, -1])
    assert np.isnan(lp[0]).all() and (ids[0] == POISON).all()  # k = -1
    assert np.isnan(lp[2]).all() and (ids[2] == POISON).all()  # padding row
    np.testing.assert_allclose(lp[1, :3], np.log(1 / 8), atol=1e-6)
    assert ids[1, :2].tolist() == [0, 1]


@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_large_logits_do_not_overflow(scale):
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((1, 49152)) * scale + 80).astype(np.float32)
    lp, ids = _run(logits, [123], [K])
    z = logits[0].astype(np.float64)
    ref = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    assert np.isfinite(lp[0]).all()
    np.testing.assert_allclose(lp[0, 0], ref[123], atol=1e-5)
    assert ids[0].tolist() == np.argsort(-ref, kind="stable")[:K].tolist()
