"""References of the batched-decode GEMM path: packed bf16 terms, K slices, reduction."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.linear_splitk import pack_terms, splitk_slice, unpack_terms


def test_pack_terms_round_trip_and_precision():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 96)) * 7).astype(np.float32)
    packed = pack_terms(x)
    assert packed.shape == x.shape and packed.dtype == np.float32
    bits = packed.view(np.uint16).reshape(5, 192)
    hi = (bits[:, :96].astype(np.uint32) << 16).view(np.float32)
    # hi is x rounded to nearest even bf16; hi + lo keeps ~16 bits (error <= 2^-16 |x|)
    assert np.array_equal(hi, (((x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1))
                                >> 16) << 16).view(np.float32))
    err = np.abs(unpack_terms(packed, 5, 96).astype(np.float64) - x)
    assert err.max() <= 2.0 ** -16 * np.abs(x).max()
    assert err.max() > 0  # f32 has more bits than two bf16 terms keep


@pytest.mark.parametrize("K_,S", [(4096, 1), (4096, 3), (14336, 16), (1000, 4), (4096, 12)])
def test_splitk_slices_cover_k_once_aligned(K_, S):
    ranges = [splitk_slice(K_, S, s) for s in range(S)]
    assert ranges[0][0] == 0 and ranges[-1][1] == K_
    for (a0, a1), (b0, _) in zip(ranges[:-1], ranges[1:], strict=True):
        assert a1 == b0 and a0 <= a1
    assert all(a % 128 == 0 for a, _ in ranges if a < K_)


def test_linear_packed_partials_sum_to_the_product():
    rng = np.random.default_rng(4)
    T, N, K_, S = 6, 40, 1000, 3
    x = rng.standard_normal((T, K_)).astype(np.float32)
    w = rng.standard_normal((N, K_)).astype(np.float32)
    xs = np.zeros_like(x)
    K.split_bf16(x, xs, T, K_)
    part = np.full((S * T, N), np.nan, np.float32)
    K.linear_packed(xs, w, part, T, N, K_, S)
    out = np.full((T, N), np.nan, np.float32)
    K.splitk_reduce(part, out, T, N, S)
    exact = unpack_terms(xs, T, K_).astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(out, exact, rtol=0, atol=1e-3)
    k0, k1 = splitk_slice(K_, S, 1)
    np.testing.assert_allclose(part[T:2 * T], unpack_terms(xs, T, K_)[:, k0:k1] @ w[:, k0:k1].T,
                               rtol=1e-6)
    res = rng.standard_normal((T, N)).astype(np.float32)
    added = res.copy()
    K.splitk_reduce_add(part, added, T, N, S)
    assert np.array_equal(added, res + out)
    p2 = np.full_like(part, np.nan)
    K.linear_partial(x, w, p2, T, N, K_, S)
    np.testing.assert_allclose(p2, part, atol=2e-3)


def test_swiglu_split_is_split_of_silu_mul():
    rng = np.random.default_rng(5)
    T, F = 3, 64
    gu = (rng.standard_normal((T, 2 * F)) * 3).astype(np.float32)
    act = np.zeros((T, F), np.float32)
    K.silu_mul(gu, act, T, F)
    a, b = np.zeros((T, F), np.float32), np.zeros((T, F), np.float32)
    K.swiglu_split_bf16(gu, a, T, F)
    K.split_bf16(act, b, T, F)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
