"""Row-wise ops against plain Python loops on small random inputs."""

import math

import numpy as np
import pytest
from helios_tools.kernels import (
    add,
    add_rmsnorm,
    embedding,
    gather_last,
    linear,
    rmsnorm,
    rope,
    silu_mul,
)

RNG = np.random.default_rng(1234)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_embedding_rows_and_out_of_range_ids_are_zero():
    table = _f32(7, 5)
    ids = np.array([3, -1, 0, 6, 7, 2], dtype=np.int32)
    out = np.full((6, 5), np.nan, dtype=np.float32)
    embedding(ids, table, out, 6, 5)
    for t, i in enumerate(ids):
        expected = table[i] if 0 <= i < 7 else np.zeros(5, np.float32)
        assert out[t].tolist() == expected.tolist()


def _rms_ref(x, w, eps):
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        ms = sum(float(v) * float(v) for v in x[t]) / x.shape[1]
        r = 1.0 / math.sqrt(ms + eps)
        for d in range(x.shape[1]):
            out[t, d] = float(x[t, d]) * r * float(w[d])
    return out


def test_rmsnorm_matches_loop():
    x, w = _f32(4, 16), _f32(16)
    out = np.empty_like(x)
    rmsnorm(x, w, out, 4, 16, 1e-5)
    np.testing.assert_allclose(out, _rms_ref(x, w, 1e-5), rtol=1e-5, atol=1e-6)


def test_add_rmsnorm_updates_residual_then_normalizes():
    x, res, w = _f32(3, 8), _f32(3, 8), _f32(8)
    res0 = res.copy()
    out = np.empty_like(x)
    add_rmsnorm(x, res, w, out, 3, 8, 1e-6)
    assert np.array_equal(res, res0 + x)
    np.testing.assert_allclose(out, _rms_ref(res0 + x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_linear_is_x_times_weight_transposed():
    x, w = _f32(3, 6), _f32(4, 6)
    out = np.empty((3, 4), np.float32)
    linear(x, w, out, 3, 4, 6)
    for t in range(3):
        for n in range(4):
            ref = sum(float(x[t, k]) * float(w[n, k]) for k in range(6))
            assert out[t, n] == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_silu_mul_and_add():
    gu = _f32(3, 10) * 4
    gu[0, 0] = -200.0  # exp overflow path must give silu -> -0, not NaN
    out = np.empty((3, 5), np.float32)
    silu_mul(gu, out, 3, 5)
    for t in range(3):
        for f in range(5):
            g = float(gu[t, f])
            ref = g / (1 + math.exp(-g)) * float(gu[t, 5 + f]) if g > -50 else 0.0
            assert out[t, f] == pytest.approx(ref, rel=1e-5, abs=1e-6)
    a, b = _f32(2, 3), _f32(2, 3)
    s = np.empty_like(a)
    add(a, b, s, 2, 3)
    assert np.array_equal(s, a + b)
    add(a, b, a, 2, 3)  # aliasing output with an input is allowed
    assert np.array_equal(a, s)


def test_gather_last_packed_rows_and_empty_rows():
    x = _f32(9, 4)
    ql = np.array([3, 0, 1, 4, -1], dtype=np.int32)
    out = np.full((5, 4), np.nan, np.float32)
    gather_last(x, ql, out, 9, 5, 4)
    assert out[0].tolist() == x[2].tolist()
    assert out[1].tolist() == [0.0] * 4
    assert out[2].tolist() == x[3].tolist()
    assert out[3].tolist() == x[7].tolist()
    assert out[4].tolist() == [0.0] * 4
    with pytest.raises(IndexError):
        gather_last(x, np.array([5, 5], np.int32), np.empty((2, 4), np.float32), 9, 2, 4)


def test_rope_half_split_rotates_q_and_k_only():
    T, H, KVH, HD = 3, 4, 2, 8
    qkv = _f32(T, (H + 2 * KVH) * HD)
    pos = np.array([0, 5, 1000], dtype=np.int32)
    inv_freq = (1.0 / (10000.0 ** (np.arange(0, HD, 2) / HD))).astype(np.float32)
    orig = qkv.copy()
    rope(qkv, pos, inv_freq, T, H, KVH, HD)
    half = HD // 2
    for t in range(T):
        for h in range(H + KVH):
            x = orig[t, h * HD : (h + 1) * HD]
            for i in range(half):
                a = float(np.float32(pos[t]) * inv_freq[i])
                c, s = math.cos(a), math.sin(a)
                assert qkv[t, h * HD + i] == pytest.approx(x[i] * c - x[i + half] * s, abs=1e-5)
                assert qkv[t, h * HD + half + i] == pytest.approx(
                    x[i + half] * c + x[i] * s, abs=1e-5
                )
    v0 = (H + KVH) * HD
    assert np.array_equal(qkv[:, v0:], orig[:, v0:])
    assert np.array_equal(qkv[0], orig[0])  # position 0 is the identity rotation
