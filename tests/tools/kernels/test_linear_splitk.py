"""References of the batched-decode GEMM path: packed bf16 terms, K slices, reduction."""

from __future__ import annotations

import ml_dtypes
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


def test_round_bf16_is_ml_dtypes_bfloat16_with_zero_lo():
    """bf16 activations: hi is ml_dtypes' round-to-nearest-even bfloat16 of x (ties,
    values next to a tie, subnormals, negative zero), the lo half all zero bits, and the
    packed product multiplies exactly hi."""
    rng = np.random.default_rng(27)
    T, K_ = 4, 130
    x = (rng.standard_normal((T, K_)) * 5).astype(np.float32)
    tie = np.float32(1 + 2 ** -8)  # halfway between two bf16 values: rounds to even (1.0)
    x[0, :6] = [tie, -3 * tie, np.nextafter(tie, np.float32(2)), -0.0, 1e-40, 3.0e30]
    out = np.full((T, K_), np.nan, np.float32)
    K.round_bf16(x, out, T, K_)
    bits = out.view(np.uint16).reshape(T, 2 * K_)
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(bits[:, :K_], want)
    assert bits[0, 0] == 0x3F80 and bits[0, 3] == 0x8000  # the tie to even, -0 kept
    assert not bits[:, K_:].any()
    hi = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(unpack_terms(out, T, K_), hi)
    w = rng.standard_normal((8, K_)).astype(np.float32)
    part = np.full((T, 8), np.nan, np.float32)
    K.linear_packed(out, w, part, T, 8, K_, 1)
    assert np.array_equal(part, hi @ w.T)


def test_swiglu_round_is_round_of_silu_mul():
    rng = np.random.default_rng(28)
    T, F = 3, 70
    x = rng.standard_normal((T, 2 * F)).astype(np.float32)
    act = np.zeros((T, F), np.float32)
    K.silu_mul(x, act, T, F)
    want = np.zeros_like(act)
    K.round_bf16(act, want, T, F)
    got = np.full_like(act, np.nan)
    K.swiglu_round_bf16(x, got, T, F)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_cpu_backend_runs_the_references():
    """The cpu backend executes REFERENCE_OPS as they are: the rounded producers are the
    functions tested above, with split_bf16's parameter list."""
    from helios_tools.kernels import REFERENCE_OPS, kernel_params

    assert REFERENCE_OPS["round_bf16"] is K.round_bf16
    assert REFERENCE_OPS["swiglu_round_bf16"] is K.swiglu_round_bf16
    for op in ("round_bf16", "swiglu_round_bf16"):
        assert kernel_params(op) == kernel_params("split_bf16")
