"""The repacked-GGUF references (helios_tools.kernels.int8): INT4_MIN (``code * scale +
min``) and INT8 (``code * scale``) dequantization by hand, and every form equal to the
plain product / gather over the dequantized weight."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.int4 import pack_int4
from helios_tools.kernels.int8 import (
    INT4_MIN_FORMS,
    INT8_FORMS,
    dequantize_int4_min,
    dequantize_int8,
)


def test_int4_min_by_hand():
    """Codes [0, 15, 3, 1] in groups of 2: scales [0.5, 2], minimums [-1, 0.25]:
    0 * 0.5 - 1, 15 * 0.5 - 1, 3 * 2 + 0.25, 1 * 2 + 0.25."""
    packed = pack_int4(np.array([[0, 15, 3, 1]]))
    w = dequantize_int4_min(packed, np.array([[0.5, 2.0]], np.float32),
                            np.array([[-1.0, 0.25]], np.float32))
    assert w.dtype == np.float32 and w.tolist() == [[-1.0, 6.5, 6.25, 2.25]]


def test_int8_by_hand_reads_twos_complement_bytes():
    """Bytes 0xFF, 0x80, 0x7F, 0x02 are -1, -128, 127, 2; groups of 2 with scales 0.5, 3."""
    codes = np.array([[0xFF, 0x80, 0x7F, 0x02]], np.uint8)
    w = dequantize_int8(codes, np.array([[0.5, 3.0]], np.float32))
    assert w.dtype == np.float32 and w.tolist() == [[-0.5, -64.0, 381.0, 6.0]]


def _weights(rng, N, K_, group, kind):
    scales = (rng.random((N, K_ // group)) * 0.02 + 1e-3).astype(np.float32)
    if kind == "int4_min":
        mins = (-rng.random((N, K_ // group)) * 0.1).astype(np.float32)
        packed = pack_int4(rng.integers(0, 16, (N, K_)))
        return (packed, scales, mins), dequantize_int4_min(packed, scales, mins)
    codes = rng.integers(-128, 128, (N, K_)).astype(np.int8).view(np.uint8)
    return (codes, scales), dequantize_int8(codes, scales)


@pytest.mark.parametrize("kind,forms", [("int4_min", INT4_MIN_FORMS), ("int8", INT8_FORMS)])
def test_every_form_is_its_plain_op_over_the_dequantized_weight(kind, forms):
    """Each form against the plain op of helios_tools.kernels with the dequantized f32
    weight: the same NumPy computation, so equal bitwise; and the f32 binding (the cpu
    backend's, dequantized once) gives the same output again."""
    rng = np.random.default_rng(7)
    T, N, K_, group = 3, 24, 64, 16
    sides, w = _weights(rng, N, K_, group, kind)
    x = rng.standard_normal((T, 2 * K_)).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(K_)).astype(np.float32)
    res = rng.standard_normal((T, N)).astype(np.float32)
    for plain, op in forms.items():
        if plain == "embedding":
            ids = np.array([0, -1, N - 1, N], np.int32)
            want, got, bound = (np.full((4, K_), 5, np.float32) for _ in range(3))
            K.reference_op("embedding")(ids, w, want, 4, K_)
            K.reference_op(op)(ids, *sides, got, 4, K_)
            K.reference_op(op)(ids, w, sides[1], bound, 4, K_)
        else:
            xin = x if plain.startswith("swiglu") else np.ascontiguousarray(x[:, :K_])
            pre = (g,) if plain.startswith("rmsnorm") else ()
            tail = (T, N, K_, 1e-5) if plain.startswith("rmsnorm") else (T, N, K_)
            want, got, bound = res.copy(), res.copy(), res.copy()
            K.reference_op(plain)(xin, *pre, w, want, *tail)
            K.reference_op(op)(xin, *pre, *sides, got, *tail)
            K.reference_op(op)(xin, *pre, w, *sides[1:], bound, *tail)
        np.testing.assert_array_equal(got, want, err_msg=op)
        np.testing.assert_array_equal(bound, want, err_msg=op)


def test_the_forms_cover_the_same_products_as_int4():
    from helios_tools.kernels.int4 import INT4_FORMS

    assert set(INT4_MIN_FORMS) == set(INT4_FORMS)
    assert set(INT8_FORMS) == set(INT4_FORMS) | {"embedding"}
