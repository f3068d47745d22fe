"""The bf16 KV cache references (helios_tools/kernels/kv_bf16.py): the write rounds as
ml_dtypes' ``bfloat16`` does (nearest, ties to even), and every form equals its f32 op,
bit for bit, over the widened planes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.kv_bf16 import KV_BF16_FORMS, Bf16Plane, decode_bf16, encode_bf16

H, KVH, HD, PT, MP = 6, 2, 8, 4, 8


def test_encode_bf16_rounds_as_ml_dtypes_bfloat16():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4000) * 40).astype(np.float32)
    bits = x.view(np.uint32)
    bits[:1000] = (bits[:1000] & 0xFFFF0000) | 0x8000  # exact ties, both parities
    x[1000:1004] = [3.4e38, -3.4e38, 1e-40, -0.0]  # to inf, to inf, a subnormal, -0
    x[1004:1006] = [np.inf, -np.inf]
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(encode_bf16(x), want)
    assert encode_bf16(np.float32(1.00390625)) == 0x3F80  # 1 + 2**-8: a tie, to even (1.0)
    assert encode_bf16(np.float32(1.01171875)) == 0x3F82  # 1 + 3 * 2**-8: a tie, up
    np.testing.assert_array_equal(decode_bf16(want), x.astype(ml_dtypes.bfloat16)
                                  .astype(np.float32))


def test_nan_stays_nan_of_its_sign():
    x = np.array([np.nan, -np.nan], np.float32)
    x.view(np.uint32)[0] = 0x7F800001  # a signalling NaN whose payload rounding would lose
    got = decode_bf16(encode_bf16(x))
    assert np.isnan(got).all() and list(np.signbit(got)) == [False, True]


def _setup(rng, B=3):
    P = B * MP + 1
    pages = rng.permutation(P - 1)[:B * MP].reshape(B, MP).astype(np.int32)
    kc = encode_bf16(rng.standard_normal((P, PT, KVH, HD)))
    vc = encode_bf16(rng.standard_normal((P, PT, KVH, HD)))
    return pages, kc, vc, decode_bf16(kc), decode_bf16(vc)


@pytest.mark.parametrize("op", ["kv_write", "rope_kv_write"])
def test_writes_store_the_f32_op_rounded_and_skip_padding(op):
    rng = np.random.default_rng(1)
    pages, kc, vc, kf, vf = _setup(rng)
    T, R = 5, 3
    qkv = (rng.standard_normal((T, (H + 2 * KVH) * HD)) * 3).astype(np.float32)
    trow = np.array([0, 0, -1, 2, 1], np.int32)
    slot = np.array([2, 0, -1], np.int32)
    pos = np.array([3, 4, 0, 9, 17], np.int32)
    rope = (np.linspace(1, 0.01, HD // 2).astype(np.float32),) if op == "rope_kv_write" else ()
    q16, k2, v2 = qkv.copy(), kc.copy(), vc.copy()
    K.reference_op(KV_BF16_FORMS[op])(q16, pos, *rope, trow, slot, pages, k2, v2, T, R, MP,
                                      PT, H, KVH, HD)
    q32, fk, fv = qkv.copy(), kf.copy(), vf.copy()
    K.reference_op(op)(q32, pos, *rope, trow, slot, pages, fk, fv, T, R, MP, PT, H, KVH, HD)
    np.testing.assert_array_equal(q16, q32)  # the rotated f32 keys stay f32 in qkv
    np.testing.assert_array_equal(k2, encode_bf16(fk))
    np.testing.assert_array_equal(v2, encode_bf16(fv))
    changed = (k2 != kc).any(axis=(2, 3))
    assert changed.sum() == 3  # token 2 is padding, token 3's row has no slot


def test_readers_equal_their_f32_op_over_the_widened_planes():
    """Bit for bit: the forms widen exactly the positions the f32 op gathers."""
    rng = np.random.default_rng(2)
    B = 3
    pages, kc, vc, kf, vf = _setup(rng, B)
    width = (H + 2 * KVH) * HD
    q = rng.standard_normal((B, width)).astype(np.float32)
    pos = np.array([0, 13, 31], np.int32)
    slot = np.array([1, -1, 2], np.int32)
    scale = HD ** -0.5
    NS, SPLIT = 4, 8
    rows = np.array([0, 1, 2], np.int32)
    cases = {
        "attention_decode_split": lambda c: (
            q, pos, slot, pages, *c, np.zeros((B, H, NS, 2), np.float32),
            np.zeros((B, H, NS, HD), np.float32), B, MP, PT, H, KVH, HD, NS, SPLIT, scale),
        "attention_decode_split_tuned": lambda c: (
            q, pos, slot, pages, *c, np.zeros((B, H, NS, 2), np.float32),
            np.zeros((B, H, NS, HD), np.float32), np.array([2], np.int32), B, MP, PT, H, KVH,
            HD, NS, SPLIT, scale),
        "attention_decode_fused": lambda c: (
            q, pos, slot, pages, *c, np.zeros((B, H, NS, 2), np.float32),
            np.zeros((B, H, NS, HD), np.float32), np.zeros((B, KVH), np.int32),
            np.zeros((B, H * HD), np.float32), B, MP, PT, H, KVH, HD, NS, SPLIT, scale),
        "attention_decode_window": lambda c: (
            q, pos, slot, pages, *c, np.zeros((B, H * HD), np.float32), B, MP, PT, H, KVH, HD,
            5, scale),
        "attention_prefill": lambda c: (
            q, pos, rows, slot, pages, *c, np.zeros((B, H * HD), np.float32), B, B, MP, PT, H,
            KVH, HD, scale),
        "attention_prefill_window": lambda c: (
            q, pos, rows, slot, pages, *c, np.zeros((B, H * HD), np.float32), B, B, MP, PT, H,
            KVH, HD, 7, scale),
    }
    for op, make in cases.items():
        plain = make((kf, vf))
        K.reference_op(op)(*plain)
        coded = make((kc, vc))
        K.reference_op(KV_BF16_FORMS[op])(*coded)
        outs = [i for i, p in enumerate(K.kernel_params(op)) if p.direction != "in"]
        assert outs, op
        for i in outs:
            np.testing.assert_array_equal(coded[i], plain[i], err_msg=op)
            assert plain[i].dtype != np.float32 or np.abs(plain[i]).sum() > 0, op


def test_row_copy_moves_bit_patterns():
    rng = np.random.default_rng(3)
    src = encode_bf16(rng.standard_normal((5, PT, KVH, HD)))
    dst = np.zeros((3, PT, KVH, HD), np.uint16)
    K.reference_op("row_copy_bf16kv")(src, dst, np.array([4, -1, 1], np.int32),
                                      np.array([0, 2, 2], np.int32), 3, PT * KVH * HD)
    np.testing.assert_array_equal(dst[0], src[4])
    np.testing.assert_array_equal(dst[2], src[1])
    assert not dst[1].any()


def test_a_bf16_plane_is_uint16_read_as_flat_token_rows():
    plane = Bf16Plane(np.zeros((3, PT, KVH, HD), np.uint16))
    assert plane.reshape(-1, KVH, HD)[np.array([0, 5])].dtype == np.float32
    with pytest.raises(ValueError, match=r"read as \(-1, 2, 8\)"):
        plane.reshape(3, -1)
    with pytest.raises(TypeError, match="uint16 bit patterns, not float32"):
        Bf16Plane(np.zeros((3, PT, KVH, HD), np.float32))


def test_every_form_has_its_op_params_with_bf16_planes():
    for op, form in KV_BF16_FORMS.items():
        base, got = K.kernel_params(op), K.kernel_params(form)
        assert [p.name for p in got] == [p.name for p in base]
        for b, p in zip(base, got, strict=True):
            want = "bf16" if p.name in ("k_cache", "v_cache", "src", "dst") else b.dtype
            assert (p.dtype, p.kind, p.direction) == (want, b.kind, b.direction)
