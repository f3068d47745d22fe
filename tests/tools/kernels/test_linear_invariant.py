"""`linear_invariant`: a row's f32 result does not depend on how many rows the call has.

This is the property greedy speculative identity rests on (a verified position's logits
equal the decode program's): it holds when the BLAS computes each GEMV output feature from
its weight row and input row alone, whatever chunk of the matrix the call covers. The
shapes are SmolLM2-135M's and its drafter's projections, plus odd ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import linear, linear_invariant
from helios_tools.kernels.linear import invariant_chunks

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (8192, 576), (49152, 576),
          (577, 333), (1001, 64), (17, 5)]


def _run(op, x, w):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    op(x, w, out, x.shape[0], w.shape[0], w.shape[1])
    return out


@pytest.mark.parametrize(("N", "K"), SHAPES)
def test_rows_equal_one_row_calls_bit_for_bit(N, K):
    rng = np.random.default_rng(N * 7 + K)
    w = rng.standard_normal((N, K), dtype=np.float32)
    x = rng.standard_normal((33, K), dtype=np.float32)
    alone = np.concatenate([_run(linear_invariant, x[t:t + 1], w) for t in range(33)])
    # One row is exactly what `linear` computes for one row (the default core's decode).
    assert np.array_equal(alone[:1], _run(linear, x[:1], w))
    for T in (2, 3, 4, 5, 8, 12, 16, 32, 33):
        got = _run(linear_invariant, x[:T], w)
        assert np.array_equal(got, alone[:T]), f"T={T}"
    np.testing.assert_allclose(alone, x @ w.T.astype(np.float64), rtol=2e-4, atol=2e-4)


def test_rows_do_not_depend_on_their_neighbours():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((960, 576), dtype=np.float32)
    x = rng.standard_normal((4, 576), dtype=np.float32)
    other = x.copy()
    other[[0, 2, 3]] = rng.standard_normal((3, 576), dtype=np.float32)
    assert np.array_equal(_run(linear_invariant, x, w)[1], _run(linear_invariant, other, w)[1])


def test_writes_only_the_first_T_rows_and_N_features():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 32), dtype=np.float32)
    x = rng.standard_normal((5, 32), dtype=np.float32)
    out = np.full((6, 70), 7.0, np.float32)
    linear_invariant(x, w, out, 3, 64, 32)
    assert np.array_equal(out[:3, :64], _run(linear_invariant, x[:3], w))
    assert (out[3:] == 7.0).all() and (out[:, 64:] == 7.0).all()


@pytest.mark.parametrize(("N", "K"), [(49152, 576), (576, 1536), (226, 576), (17, 5), (1, 8)])
def test_chunks_cover_every_feature_once_and_none_has_one_row(N, K):
    chunks = invariant_chunks(N, K)
    assert chunks[0][0] == 0 and chunks[-1][1] == N
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))
    assert all(stop - start >= 2 for start, stop in chunks) or N == 1
    assert all(start % 16 == 0 for start, _ in chunks)


def test_chunk_size_follows_K_only():
    assert invariant_chunks(49152, 576)[0] == (0, 224)  # 512 KiB of f32 weights per call
    assert invariant_chunks(576, 1536)[0] == (0, 80)
    assert invariant_chunks(225, 576) == [(0, 225)]  # a one-feature tail joins its neighbour


@pytest.mark.parametrize(("N", "K", "S"), [(960, 576, 1), (577, 1536, 3), (4096, 1024, 4)])
def test_packed_rows_are_row_invariant_and_equal_linear_packed(N, K, S):
    """`linear_packed_rows` (the packed path of row-invariant products): each row bitwise
    the row alone, within f32 rounding of `linear_packed` (which is a GEMM on the CPU)."""
    from helios_tools.kernels import linear_packed, linear_packed_rows, split_bf16

    rng = np.random.default_rng(N + K + S)
    w = rng.standard_normal((N, K), dtype=np.float32)
    x = rng.standard_normal((9, K), dtype=np.float32)
    xs = np.zeros_like(x)
    split_bf16(x, xs, 9, K)

    def run(op, rows):
        part = np.full((S * len(rows), N), np.nan, np.float32)
        op(np.ascontiguousarray(xs[rows]), w, part, len(rows), N, K, S)
        return part.reshape(S, len(rows), N)

    alone = np.concatenate([run(linear_packed_rows, [t]) for t in range(9)], axis=1)
    order = [4, 0, 8, 2]
    assert np.array_equal(run(linear_packed_rows, list(range(9))), alone)
    assert np.array_equal(run(linear_packed_rows, order), alone[:, order])
    np.testing.assert_allclose(run(linear_packed, list(range(9))), alone, rtol=1e-4, atol=1e-3)
