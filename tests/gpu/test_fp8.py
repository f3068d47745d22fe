"""The FP8 W8A8 Triton products (kernels_triton/fp8.py) against their NumPy references
(helios_tools/kernels/fp8.py) on the GPU, at SmolLM2 and Llama-3.1-8B shapes: batch 1
(the GEMV), batched decode and prefill rows (tl.dot on e4m3 operands).

The GPU converts activations to e4m3 with cvt.rn.satfinite (round to nearest even,
saturating), the reference's rule, from the same f32 quotient ``a / s`` for ``linear_fp8``
and the SwiGLU forms (SwiGLU's exp may differ by an ulp from NumPy's, moving an element
across a rounding boundary now and then); the RMS prologue computes its reciprocal RMS
in another order than NumPy's mean. So the bound is relative 2e-3 (one e4m3 step on a
few elements of K), not exact; a wrong scale, code or layout errs by 1e-1 or more.
A separate case checks the activation codes exactly where no prologue is involved:
inputs whose quotients are e4m3 values and ties.
"""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.fp8 import decode_e4m3, quantize_rows

pytestmark = pytest.mark.gpu

SHAPES = [(1, 960, 576), (1, 6144, 4096), (1, 4096, 14336), (1, 28672, 4096),
          (8, 6144, 4096), (64, 4096, 14336), (256, 28672, 4096), (300, 4096, 512),
          (5, 1536, 576), (33, 576, 1536)]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


def _inputs(rng, T, N, K_):
    x = (rng.standard_normal((T, 2 * K_)) * 2).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    codes, scales = quantize_rows((rng.standard_normal((N, K_)) / np.sqrt(K_)).astype(np.float32))
    res = rng.standard_normal((T, N)).astype(np.float32)
    return x, g, codes, scales, res


@pytest.mark.parametrize("T,N,K_", SHAPES)
@pytest.mark.parametrize("op", ["linear_fp8", "linear_add_fp8", "rmsnorm_linear_fp8",
                                "swiglu_linear_fp8", "swiglu_linear_add_fp8"])
def test_fp8_product(gpu, rng, op, T, N, K_):
    x, g, codes, scales, res = _inputs(rng, T, N, K_)
    xin = x if op.startswith("swiglu") else np.ascontiguousarray(x[:, :K_])
    pre = (g,) if op.startswith("rmsnorm") else ()
    tail = (T, N, K_, 1e-5) if op.startswith("rmsnorm") else (T, N, K_)
    acc = op.endswith("_add_fp8")
    ref = res.copy() if acc else np.zeros((T, N), np.float32)
    K.reference_op(op)(xin, *pre, codes, scales, ref, *tail)
    out = gpu.run(op, xin, *pre, codes, scales, res.copy() if acc else np.zeros_like(ref),
                  *tail)["out"]
    if acc:
        out, ref = out - res, ref - res
    assert rel(out, ref) < 2e-3


@pytest.mark.parametrize("T", [1, 16, 64])
def test_activation_codes_exact(gpu, T):
    """Rows whose max is 448 (scale 1): every element an e4m3 value or the midpoint of two
    (ties to even), against one-hot weight rows, so out[t, n] is the decoded code of
    x[t, n] exactly."""
    N = K_ = 128
    values = decode_e4m3(np.arange(127, dtype=np.uint8)).astype(np.float64)
    mids = (values[:-1] + values[1:]) / 2
    pool = np.concatenate([values, mids, -values, -mids]).astype(np.float32)
    rng = np.random.default_rng(T)
    x = rng.choice(pool, (T, K_)).astype(np.float32)
    x[:, 0] = 448.0
    codes, scales = quantize_rows(np.eye(N, K_, dtype=np.float32))
    ref = np.zeros((T, N), np.float32)
    K.reference_op("linear_fp8")(x, codes, scales, ref, T, N, K_)
    out = gpu.run("linear_fp8", x, codes, scales, np.zeros_like(ref), T, N, K_)["out"]
    assert np.array_equal(out, ref)
