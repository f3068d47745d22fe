"""The e4m3 KV cache references (helios_tools/kernels/kv_fp8.py): the write quantizes as
ml_dtypes' ``float8_e4m3fn`` does after clamping to +-448 x the scale, and every reader
form equals its f32 op, bit for bit, over the dequantized planes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.fp8 import decode_e4m3
from helios_tools.kernels.kv_fp8 import (
    KV_FP8_FORMS,
    E4m3Plane,
    dequantize_kv,
    quantize_kv,
)

H, KVH, HD, PT, MP = 6, 2, 8, 4, 8


def test_quantize_kv_is_ml_dtypes_e4m3fn_after_saturation():
    rng = np.random.default_rng(0)
    scale = np.array([0.05, 2.0], np.float32)
    x = (rng.standard_normal((500, KVH, HD)) * 40).astype(np.float32)
    x[0, 0, 0], x[0, 1, 0] = 1e6, -1e6  # far past 448 x the scale
    codes = quantize_kv(x, scale)
    want = np.clip(x / scale[:, None], -448, 448).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(codes, want.view(np.uint8))
    assert decode_e4m3(codes[0, 0, 0]) == 448 and decode_e4m3(codes[0, 1, 0]) == -448
    np.testing.assert_array_equal(dequantize_kv(codes, scale),
                                  decode_e4m3(codes) * scale[:, None])


def _setup(rng, B=3):
    P = B * MP + 1
    pages = rng.permutation(P - 1)[:B * MP].reshape(B, MP).astype(np.int32)
    ks = np.array([0.01, 0.03], np.float32)
    vs = np.array([0.02, 0.005], np.float32)
    kc = quantize_kv(rng.standard_normal((P, PT, KVH, HD)), ks)
    vc = quantize_kv(rng.standard_normal((P, PT, KVH, HD)), vs)
    return pages, kc, vc, ks, vs, dequantize_kv(kc, ks), dequantize_kv(vc, vs)


def test_kv_write_fp8kv_writes_quantized_rows_and_skips_padding():
    rng = np.random.default_rng(1)
    pages, kc, vc, ks, vs, _, _ = _setup(rng)
    T, R = 5, 3
    qkv = (rng.standard_normal((T, (H + 2 * KVH) * HD)) * 3).astype(np.float32)
    trow = np.array([0, 0, -1, 2, 1], np.int32)
    slot = np.array([2, 0, -1], np.int32)
    pos = np.array([3, 4, 0, 9, 17], np.int32)
    k2, v2 = kc.copy(), vc.copy()
    K.reference_op("kv_write_fp8kv")(qkv, pos, trow, slot, pages, k2, v2, ks, vs, T, R, MP, PT,
                                     H, KVH, HD)
    fk, fv = np.zeros((*kc.shape,), np.float32), np.zeros((*vc.shape,), np.float32)
    K.kv_write(qkv, pos, trow, slot, pages, fk, fv, T, R, MP, PT, H, KVH, HD)
    touched = np.zeros(kc.shape[:2], bool)
    for r, p in zip(trow, pos, strict=True):
        if r >= 0 and slot[r] >= 0:
            touched[pages[slot[r], p // PT], p % PT] = True
    assert touched.sum() == 3  # token 2 is padding, token 3's row has no slot
    np.testing.assert_array_equal(k2[touched], quantize_kv(fk[touched], ks))
    np.testing.assert_array_equal(v2[touched], quantize_kv(fv[touched], vs))
    np.testing.assert_array_equal(k2[~touched], kc[~touched])
    np.testing.assert_array_equal(v2[~touched], vc[~touched])


def test_readers_equal_their_f32_op_over_the_dequantized_planes():
    """Bit for bit: the forms decode exactly the positions the f32 op gathers."""
    rng = np.random.default_rng(2)
    B = 3
    pages, kc, vc, ks, vs, kf, vf = _setup(rng, B)
    width = (H + 2 * KVH) * HD
    q = rng.standard_normal((B, width)).astype(np.float32)
    pos = np.array([0, 13, 31], np.int32)
    slot = np.array([1, -1, 2], np.int32)
    scale = HD ** -0.5
    NS, SPLIT = 4, 8
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
            q, pos, np.array([0, 1, 2], np.int32), slot, pages, *c,
            np.zeros((B, H * HD), np.float32), B, B, MP, PT, H, KVH, HD, scale),
        "attention_prefill_window": lambda c: (
            q, pos, np.array([0, 1, 2], np.int32), slot, pages, *c,
            np.zeros((B, H * HD), np.float32), B, B, MP, PT, H, KVH, HD, 7, scale),
    }
    for op, make in cases.items():
        plain = make((kf, vf))
        K.reference_op(op)(*plain)
        coded = make((kc, vc, ks, vs))
        K.reference_op(KV_FP8_FORMS[op])(*coded)
        params = K.kernel_params(op)
        outs = [i for i, p in enumerate(params) if p.direction != "in"]
        assert outs, op
        for i in outs:
            j = i + 2  # the scales shift every later argument by two
            np.testing.assert_array_equal(coded[j], plain[i], err_msg=op)


def test_an_e4m3_plane_is_read_only_as_flat_token_rows():
    plane = E4m3Plane(np.zeros((3, PT, KVH, HD), np.uint8), np.ones(KVH, np.float32))
    assert plane.reshape(-1, KVH, HD)[np.array([0, 5])].shape == (2, KVH, HD)
    with pytest.raises(ValueError, match=r"read as \(-1, 2, 8\)"):
        plane.reshape(3, -1)


def test_every_form_has_its_op_params_with_u8_planes():
    for op, form in KV_FP8_FORMS.items():
        base = [p.name for p in K.kernel_params(op)]
        got = K.kernel_params(form)
        names = [p.name for p in got]
        if op == "row_copy":
            assert names == base
        else:
            at = base.index("v_cache") + 1
            assert names == base[:at] + ["k_scale", "v_scale"] + base[at:]
        for p in got:
            if p.name in ("k_cache", "v_cache", "src", "dst"):
                assert p.dtype == "u8"
