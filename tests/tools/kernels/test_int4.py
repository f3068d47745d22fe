"""INT4 group quantization and the W4A16 reference ``linear_int4`` (helios_tools.kernels
.int4) against hand-computed values: two codes a byte, element 2i in the low nibble,
codes symmetric around 8, one f32 scale per group of consecutive elements."""

from __future__ import annotations

import numpy as np
from helios_tools.kernels.int4 import (
    dequantize_int4,
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
    """Group [7, -3.5, 0, 1.75] (group 4): scale 7 / 7 = 1, codes round(w) + 8 with ties
    to even (-3.5 -> -4, 1.75 -> 2): 15, 4, 8, 10; a zero group: scale 1, codes 8."""
    w = np.array([[7.0, -3.5, 0.0, 1.75, 0.0, 0.0, 0.0, 0.0]], np.float32)
    packed, scales = quantize_int4(w, group=4)
    assert scales.tolist() == [[1.0, 1.0]]
    assert unpack_int4(packed).tolist() == [[15, 4, 8, 10, 8, 8, 8, 8]]
    assert dequantize_int4(packed, scales).tolist() == [[7.0, -4.0, 0.0, 2.0, 0, 0, 0, 0]]


def test_a_negative_maximum_sets_the_scale():
    """max |group| = 7 from -7: scale 1, codes -7 + 8 = 1 and round(3.5) + 8 = 12 (ties to
    even); the symmetric scale never reaches code 0 (-8)."""
    packed, scales = quantize_int4(np.array([[-7.0, 3.5]], np.float32), group=2)
    assert scales.tolist() == [[1.0]] and unpack_int4(packed).tolist() == [[1, 12]]


def test_linear_int4_is_the_product_with_the_dequantized_weight():
    rng = np.random.default_rng(2)
    T, N, K = 3, 20, 256
    x = rng.standard_normal((T, K)).astype(np.float32)
    packed, scales = quantize_int4(rng.standard_normal((N, K)).astype(np.float32))
    out = np.full((T, N), np.nan, np.float32)
    linear_int4(x, packed, scales, out, T, N, K)
    w = dequantize_int4(packed, scales)
    np.testing.assert_array_equal(out, x @ w.T)
    # scales [N, 2]: groups of 128
    assert scales.shape == (N, 2) and packed.shape == (N, K // 2)
