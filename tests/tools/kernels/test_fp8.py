"""FP8 e4m3 encoding and the W8A8 reference ops (helios_tools.kernels.fp8) against values
computed by hand from the format (1 sign, 4 exponent bits biased by 7, 3 mantissa bits,
subnormals below 2^-6, largest finite 448, 0x7F NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import reference_op
from helios_tools.kernels.fp8 import (
    decode_e4m3,
    encode_e4m3,
    linear_fp8,
    quantize_rows,
)

HAND = [
    (1.0, 0x38),          # 2^0: exponent field 7, mantissa 0
    (0.1, 0x1D),          # 1.6 x 2^-4 -> mantissa 4.8/8 rounds to 5: 0.1015625
    (448.0, 0x7E),        # the largest finite
    (500.0, 0x7E),        # saturates
    (464.0, 0x7E),        # the tie with 480 (not finite) saturates too
    (-448.0, 0xFE),
    (17.0, 0x58),         # tie between 16 (0x58) and 18 (0x59): the even mantissa
    (19.0, 0x5A),         # tie between 18 (0x59) and 20 (0x5A): the even mantissa
    (2.0 ** -6, 0x08),    # the smallest normal
    (2.0 ** -9, 0x01),    # the smallest subnormal
    (2.0 ** -10, 0x00),   # tie between 0 and 2^-9: even (0)
    (3 * 2.0 ** -10, 0x02),  # tie between 2^-9 (0x01) and 2^-8 (0x02): even
    (0.0019, 0x01),
    (-3.3, 0xC5),         # -(1.625 x 2^1) = -3.25
]


@pytest.mark.parametrize(("value", "code"), HAND, ids=[f"{v!r}" for v, _ in HAND])
def test_encode_rounds_to_nearest_even_and_saturates(value, code):
    assert int(encode_e4m3(np.float32(value))) == code


def test_signed_zero_and_nan():
    assert encode_e4m3(np.array([0.0, -0.0, np.nan], np.float32)).tolist() == [0x00, 0x80, 0x7F]


def test_decode_values():
    got = decode_e4m3(np.array([0x38, 0x1D, 0x7E, 0xFE, 0x08, 0x01, 0x80], np.uint8))
    assert got.tolist() == [1.0, 0.1015625, 448.0, -448.0, 2.0 ** -6, 2.0 ** -9, -0.0]
    assert np.isnan(decode_e4m3(np.array([0x7F, 0xFF], np.uint8))).all()


def test_every_finite_code_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    assert np.array_equal(encode_e4m3(decode_e4m3(codes)), codes)


def test_matches_ml_dtypes_where_installed():
    """An independent encoder (ml_dtypes' float8_e4m3fn cast after clamping, what torch's
    quantizers do) agrees on random values and on every tie."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    values = decode_e4m3(np.arange(126, dtype=np.uint8)).astype(np.float64)
    ties = (values[:-1] + values[1:]) / 2
    x = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.uniform(-4, 3, 20000),
                        ties, -ties]).astype(np.float32)
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(encode_e4m3(x), want)


def test_quantize_rows_scales_each_row_by_its_max():
    codes, scales = quantize_rows(np.array([[1.0, -2.0, 4.0], [0.0, 0.0, 0.0]], np.float32))
    assert scales.tolist() == [[np.float32(4.0) / np.float32(448)], [1.0]]
    # 112 = 1.75 x 2^6, -224 = -1.75 x 2^7, 448
    assert codes.tolist() == [[0x6E, 0xF6, 0x7E], [0, 0, 0]]


def test_linear_fp8_by_hand():
    """x = [1, -2, 4] (codes 112, -224, 448 x 4/448), w row 0 = [1, 0, 0.5] (codes 448, 0,
    224 x 1/448): (112 x 448 + 448 x 224) x 4/448 x 1/448 = 3; row 1 is zeros."""
    x = np.array([[1.0, -2.0, 4.0]], np.float32)
    wc, ws = quantize_rows(np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]], np.float32))
    out = np.full((1, 2), 7.0, np.float32)
    linear_fp8(x, wc, ws, out, 1, 2, 3)
    assert out[0, 0] == pytest.approx(3.0, rel=1e-6) and out[0, 1] == 0.0


def test_fused_forms_are_their_compositions():
    rng = np.random.default_rng(1)
    T, N, K = 5, 24, 40
    x2 = rng.standard_normal((T, 2 * K)).astype(np.float32)
    x = x2[:, :K].copy()
    gain = (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)
    wc, ws = quantize_rows(rng.standard_normal((N, K)).astype(np.float32))
    res = rng.standard_normal((T, N)).astype(np.float32)

    def run(op, *args):
        out = res.copy()
        reference_op(op)(*args[:-2], out, *args[-1])
        return out

    h = np.zeros((T, K), np.float32)
    reference_op("rmsnorm")(x, gain, h, T, K, 1e-5)
    act = np.zeros((T, K), np.float32)
    reference_op("silu_mul")(x2, act, T, K)
    plain = run("linear_fp8", x, wc, ws, None, (T, N, K))
    assert np.array_equal(run("linear_add_fp8", x, wc, ws, None, (T, N, K)), res + plain)
    assert np.array_equal(run("rmsnorm_linear_fp8", x, gain, wc, ws, None, (T, N, K, 1e-5)),
                          run("linear_fp8", h, wc, ws, None, (T, N, K)))
    swiglu = run("swiglu_linear_fp8", x2, wc, ws, None, (T, N, K))
    assert np.array_equal(swiglu, run("linear_fp8", act, wc, ws, None, (T, N, K)))
    assert np.array_equal(run("swiglu_linear_add_fp8", x2, wc, ws, None, (T, N, K)),
                          res + swiglu)
    # decoded f32 weights (the cpu backend's binding) give the same product
    assert np.array_equal(run("linear_fp8", x, decode_e4m3(wc), ws, None, (T, N, K)), plain)
    # and the product is within e4m3's resolution of the f32 one
    exact = x @ (decode_e4m3(wc) * ws).T
    assert np.max(np.abs(plain - exact)) < 0.1 * np.max(np.abs(exact))
