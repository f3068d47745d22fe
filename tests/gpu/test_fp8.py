"""The FP8 W8A8 Triton products (kernels_triton/fp8.py) against their NumPy references
(helios_tools/kernels/fp8.py) on the GPU, at SmolLM2 and Llama-3.1-8B shapes: batch 1
(the GEMV), a few rows (the GEMV with several token rows a program), batched decode and
prefill rows (tl.dot on e4m3 operands), and every op at the 8B matrices x 1, 2, 8, 16,
64, 256 and 1,024 rows (under the committed tile table, or the
sweep's picks with ``HELIOS_FP8_TILES=<sweep JSON>``: bench/gpu_device.sh fp8-tune).

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

import functools

import numpy as np
import pytest
from helios_ignition.capture import launch
from helios_tools import kernels as K
from helios_tools.kernels.fp8 import decode_e4m3, quantize_rows

pytestmark = pytest.mark.gpu

SHAPES = [(1, 960, 576), (5, 1536, 576), (33, 576, 1536), (300, 4096, 512), (3, 100, 100)]
# The Llama-3.1-8B products (qkv, o, gate_up, down) at the row counts decode and prefill
# launch: each row count takes its own path or tile (launch.fp8_constants).
SHAPES_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
ROWS_8B = [1, 2, 8, 16, 64, 256, 1024]
OPS = ["linear_fp8", "linear_add_fp8", "rmsnorm_linear_fp8", "swiglu_linear_fp8",
       "swiglu_linear_add_fp8"]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all(), "GPU output holds NaN/inf (unwritten or poisoned)"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


@functools.lru_cache(maxsize=2)
def _weights(N: int, K_: int):
    """Random finite e4m3 codes (either sign, never NaN) and per-row scales of an N x K
    weight, drawn once per shape (quantizing 117M normal values per test would dominate):
    each test draws fresh activations and residuals."""
    rng = np.random.default_rng(N * 100003 + K_)
    codes = (rng.integers(0, 0x7F, (N, K_), dtype=np.uint8)
             | (rng.integers(0, 2, (N, K_), dtype=np.uint8) << 7))
    scales = (1 / (448 * np.sqrt(K_)) * (1 + 0.1 * rng.random((N, 1)))).astype(np.float32)
    return codes, scales


def _inputs(rng, T, N, K_, weights=None):
    x = (rng.standard_normal((T, 2 * K_)) * 2).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    if weights is None:
        codes, scales = quantize_rows((rng.standard_normal((N, K_)) / np.sqrt(K_))
                                      .astype(np.float32))
    else:
        codes, scales = weights
    res = rng.standard_normal((T, N)).astype(np.float32)
    return x, g, codes, scales, res


def _check(gpu, op, x, g, codes, scales, res, T, N, K_):
    """The op on the GPU (outputs poisoned by the harness; the _add forms start from the
    residual) against its NumPy reference: relative error of the product."""
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
    return rel(out, ref), out


@pytest.mark.parametrize("T,N,K_", SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_fp8_product(gpu, rng, op, T, N, K_):
    err, _ = _check(gpu, op, *_inputs(rng, T, N, K_), T, N, K_)
    assert err < 2e-3


@pytest.mark.parametrize("T", ROWS_8B)
@pytest.mark.parametrize("N,K_", SHAPES_8B)
@pytest.mark.parametrize("op", OPS)
def test_fp8_product_8b(gpu, rng, op, N, K_, T):
    """Every op at every 8B matrix and row count (the GEMV at 1 row, the tiles above)."""
    err, _ = _check(gpu, op, *_inputs(rng, T, N, K_, _weights(N, K_)), T, N, K_)
    assert err < 2e-3


@pytest.mark.parametrize("T", [5, 8, 16])
@pytest.mark.parametrize("few", ["table", "8,512,4"])
@pytest.mark.parametrize("op", OPS)
def test_fp8_few_rows_knob(gpu, rng, monkeypatch, op, few, T):
    """The few-row rule's alternatives (HELIOS_FP8_FEW): the table / default tiles as
    before the rows form, and the rows form with other tiles, at the 8B qkv shape."""
    monkeypatch.setattr(launch, "FP8_FEW", few)
    N, K_ = 6144, 4096
    err, _ = _check(gpu, op, *_inputs(rng, T, N, K_, _weights(N, K_)), T, N, K_)
    assert err < 2e-3


@pytest.mark.parametrize("T", [1, 8, 64])
def test_fp8_deterministic(gpu, rng, T):
    """Two launches of one product on the same inputs agree bitwise (no atomics, no
    split-K: greedy decode on FP8 cores repeats itself)."""
    N, K_ = 4096, 14336
    args = _inputs(rng, T, N, K_, _weights(N, K_))
    _, a = _check(gpu, "swiglu_linear_add_fp8", *args, T, N, K_)
    _, b = _check(gpu, "swiglu_linear_add_fp8", *args, T, N, K_)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


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
