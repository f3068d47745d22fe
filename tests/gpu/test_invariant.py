"""The row-invariant linear on the GPU (op ``linear_invariant``, kernels_triton/invariant.py):
every row of a T-row launch is bitwise the row launched alone -- what makes a verified
position's logits the decode row's (docs/speculative.md, "Exactness") -- at SmolLM2's and
the Llama-3.1-8B geometry's matrices, bf16 weights, row counts of decode (1, 8) and of
verification (4 = one W = 4 lane, 9, 32 = eight), rows in any order; and close to the
NumPy reference; and the opt-in packed rule's chain (HELIOS_LINEAR_INVARIANT=packed) at
the 8B matrices. Fresh random inputs, NaN-poisoned outputs (gpu_harness).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_harness import bf16_round
from helios_tools import kernels as K

SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]
LLAMA8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("N,K_", SMOLLM2 + LLAMA8B)
def test_linear_invariant_rows_are_the_decode_rows(gpu, rng, N, K_):
    T = 32
    x = (rng.standard_normal((T, K_)) * 2).astype(np.float32)
    bits, w = bf16_round(rng.standard_normal((N, K_), dtype=np.float32) / np.float32(np.sqrt(K_)))
    alone = np.stack([gpu.run("linear_invariant", x[t:t + 1], bits, np.zeros((1, N), np.float32),
                              1, N, K_, bf16=("weight",))["out"][0] for t in range(T)])
    ref = np.zeros((T, N), np.float32)
    K.linear_invariant(x, w, ref, T, N, K_)
    assert np.linalg.norm(alone - ref) / np.linalg.norm(ref) < 5e-6
    for n in (T, 4, 8, 9):
        rows = rng.permutation(T)[:n]
        got = gpu.run("linear_invariant", x[rows], bits, np.zeros((n, N), np.float32), n, N, K_,
                      bf16=("weight",))["out"]
        assert np.array_equal(_bits(got), _bits(alone[rows])), (n, N, K_)


def test_linear_invariant_f32_weights_and_ragged_shapes(gpu, rng):
    """f32 weights (cores exported in f32), N and K off every tile edge."""
    for N, K_ in ((37, 100), (1001, 777)):
        T = 11
        x = rng.standard_normal((T, K_)).astype(np.float32)
        w = (rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32)
        alone = np.stack([gpu.run("linear_invariant", x[t:t + 1], w,
                                  np.zeros((1, N), np.float32), 1, N, K_)["out"][0]
                          for t in range(T)])
        ref = np.zeros((T, N), np.float32)
        K.linear_invariant(x, w, ref, T, N, K_)
        assert np.linalg.norm(alone - ref) / np.linalg.norm(ref) < 1e-6
        got = gpu.run("linear_invariant", x, w, np.zeros((T, N), np.float32), T, N, K_)["out"]
        assert np.array_equal(_bits(got), _bits(alone))


def _packed_rows(gpu, x, bits, N, K_, S):
    """split_bf16 -> linear_packed_rows -> splitk_reduce (HELIOS_LINEAR_INVARIANT=packed)."""
    T = x.shape[0]
    xs = gpu.run("split_bf16", x, np.zeros_like(x), T, K_)["out"]
    part = gpu.run("linear_packed_rows", xs, bits, np.zeros((S * T, N), np.float32), T, N, K_,
                   S, bf16=("weight",))["partial"]
    if S == 1:
        return part
    return gpu.run("splitk_reduce", part, np.zeros((T, N), np.float32), T, N, S)["out"]


@pytest.mark.parametrize("N,K_", LLAMA8B[:4])
def test_packed_invariant_rows_are_the_decode_rows(gpu, rng, N, K_):
    """The opt-in packed rule (capture.launch.invariant_splits): one tensor-core tile and
    K split per matrix at every row count; each row bitwise the row alone."""
    from helios_ignition.capture import launch

    S = launch.invariant_splits(N, K_, "packed")
    T = 32
    x = (rng.standard_normal((T, K_)) * 2).astype(np.float32)
    bits, w = bf16_round(rng.standard_normal((N, K_), dtype=np.float32) / np.float32(np.sqrt(K_)))
    alone = np.stack([_packed_rows(gpu, x[t:t + 1], bits, N, K_, S)[0] for t in range(T)])
    ref = np.zeros((T, N), np.float32)
    K.linear_invariant(x, w, ref, T, N, K_)
    assert np.linalg.norm(alone - ref) / np.linalg.norm(ref) < 5e-5
    for n in (T, 4, 8, 17):
        rows = rng.permutation(T)[:n]
        got = _packed_rows(gpu, x[rows], bits, N, K_, S)
        assert np.array_equal(_bits(got), _bits(alone[rows])), (n, N, K_, S)
