"""INT4 group quantization and the W4A16 reference ``linear_int4`` (helios_tools.kernels
.int4) against hand-computed values: two codes a byte, element 2i in the low nibble,
one f32 scale and zero point per group of consecutive elements (AWQ's asymmetric
scheme)."""

from __future__ import annotations

import numpy as np
from helios_tools.kernels.int4 import (
    dequantize_int4,
    int4_group,
    linear_int4,
    pack_int4,
    quantize_int4,
    unpack_int4,
)


def test_pack_puts_element_2i_in_the_low_nibble():
    packed = pack_int4(np.array([[1, 2, 15, 0]]))
    assert packed.tolist() == [[0x21, 0x0F]]
    assert unpack_int4(packed).tolist() == [[1, 2, 15, 0]]


def test_quantize_by_hand():
    """Group [7.5, -7.5, 0, 1.5] (group 4): scale (7.5 + 7.5) / 15 = 1, zero point
    -round(-7.5) = 8 (ties to even), codes clip(round(w) + 8, 0, 15) = 15, 0, 8, 10; a zero
    group: scale 1e-5 / 15 (AWQ's floor), zero point 0, codes 0. Dequantized:
    (code - zero) * scale."""
    w = np.array([[7.5, -7.5, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0]], np.float32)
    packed, scales, zeros = quantize_int4(w, group=4)
    assert scales.tolist() == [[1.0, np.float32(1e-5) / np.float32(15)]]
    assert zeros.tolist() == [[8.0, 0.0]]
    assert unpack_int4(packed).tolist() == [[15, 0, 8, 10, 0, 0, 0, 0]]
    assert dequantize_int4(packed, scales, zeros).tolist() == [[7, -8, 0, 2, 0, 0, 0, 0]]


def test_an_all_positive_group_keeps_its_minimum():
    """[1, 4] (AWQ does not widen the range to 0): scale 3 / 15 = 0.2, zero point
    clip(-round(1 / 0.2), 0, 15) = 0 (-5 clipped), codes round(5) = 5 and round(20) -> 15."""
    packed, scales, zeros = quantize_int4(np.array([[1.0, 4.0]], np.float32), group=2)
    assert scales.tolist() == [[np.float32(3) / np.float32(15)]] and zeros.tolist() == [[0.0]]
    assert unpack_int4(packed).tolist() == [[5, 15]]


def test_the_group_is_128_else_64_or_32():
    assert [int4_group(k) for k in (4096, 576, 96, 1536, 40)] == [128, 64, 32, 128, None]


def test_linear_int4_is_the_product_with_the_dequantized_weight():
    rng = np.random.default_rng(2)
    T, N, K = 3, 20, 256
    x = rng.standard_normal((T, K)).astype(np.float32)
    packed, scales, zeros = quantize_int4(rng.standard_normal((N, K)).astype(np.float32))
    out = np.full((T, N), np.nan, np.float32)
    linear_int4(x, packed, scales, zeros, out, T, N, K)
    w = dequantize_int4(packed, scales, zeros)
    np.testing.assert_array_equal(out, x @ w.T)
    # scales [N, 2]: groups of 128
    assert scales.shape == zeros.shape == (N, 2) and packed.shape == (N, K // 2)
