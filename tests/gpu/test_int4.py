"""The W4A16 GEMV ``linear_int4`` (kernels_triton/int4.py) against its NumPy reference
(helios_tools/kernels/int4.py) at Llama-3.1-8B shapes, group 128, batch 1 and a few rows.
Same dequantized values on both sides; only the f32 summation order differs."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels.int4 import linear_int4, quantize_int4

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("T,N,K_", [(1, 6144, 4096), (1, 4096, 14336), (1, 28672, 4096),
                                    (1, 128256, 4096), (4, 4096, 4096), (1, 960, 576)])
def test_linear_int4(gpu, T, N, K_):
    rng = np.random.default_rng(T * N + K_)
    group = 128 if K_ % 128 == 0 else 64
    x = rng.standard_normal((T, K_)).astype(np.float32)
    packed, scales, zeros = quantize_int4((rng.standard_normal((N, K_)) / np.sqrt(K_))
                                   .astype(np.float32), group)
    ref = np.zeros((T, N), np.float32)
    linear_int4(x, packed, scales, zeros, ref, T, N, K_)
    out = gpu.run("linear_int4", x, packed, scales, zeros, np.zeros_like(ref), T, N, K_)["out"]
    assert np.isfinite(out).all()
    assert float(np.linalg.norm(out - ref) / np.linalg.norm(ref)) < 1e-5
