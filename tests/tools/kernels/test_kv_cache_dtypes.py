"""The stored KV cache references (helios_tools/kernels/kv_fp8.py, kv_bf16.py), each check
written once for both kinds: the writes store the f32 op's keys and values encoded (e4m3:
``quantize_kv`` with the planes' per-head scales; bf16: ``encode_bf16``) and skip padding,
every reader form equals its f32 op, bit for bit, over the decoded planes (dequantized /
widened), ``row_copy`` moves stored rows as they are, and each form has its op's parameters
with stored planes (e4m3's scales after them). Then each encoding against ml_dtypes: e4m3
as ``float8_e4m3fn`` after clamping to +-448 x the scale, bf16 as ``bfloat16`` (nearest,
ties to even).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helios_tools import kernels as K
from helios_tools.kernels.fp8 import decode_e4m3
from helios_tools.kernels.kv_bf16 import Bf16Plane, decode_bf16, encode_bf16
from helios_tools.kernels.kv_fp8 import dequantize_kv, quantize_kv

from tests.kv_cache_kinds import each_kind

H, KVH, HD, PT, MP = 6, 2, 8, 4, 8
PLANE_PARAMS = ("k_cache", "v_cache", "src", "dst")
# The per-head k and v scales of the e4m3 planes drawn here, passed after the planes.
SCALES = (np.array([0.01, 0.03], np.float32), np.array([0.02, 0.005], np.float32))


def _scales(kind) -> tuple[np.ndarray, ...]:
    return SCALES if kind.scaled else ()


def _setup(kind, rng, B=3):
    """(page table [B, MP], the planes and their scales as the forms take them, the
    decoded planes as the f32 ops take them); planes ``[B * MP + 1, PT, KVH, HD]``."""
    P = B * MP + 1
    pages = rng.permutation(P - 1)[:B * MP].reshape(B, MP).astype(np.int32)
    ks, vs = _scales(kind) or (None, None)
    kc = kind.encode(rng.standard_normal((P, PT, KVH, HD)), ks)
    vc = kind.encode(rng.standard_normal((P, PT, KVH, HD)), vs)
    return pages, (kc, vc, *_scales(kind)), (kind.decode(kc, ks), kind.decode(vc, vs))


@each_kind
@pytest.mark.parametrize("op", ["kv_write", "rope_kv_write"])
def test_writes_store_the_f32_op_encoded_and_skip_padding(op, kind):
    rng = np.random.default_rng(1)
    pages, (kc, vc, *scales), (kf, vf) = _setup(kind, rng)
    ks, vs = scales or (None, None)
    T, R = 5, 3
    qkv = (rng.standard_normal((T, (H + 2 * KVH) * HD)) * 3).astype(np.float32)
    trow = np.array([0, 0, -1, 2, 1], np.int32)
    slot = np.array([2, 0, -1], np.int32)
    pos = np.array([3, 4, 0, 9, 17], np.int32)
    rope = (np.linspace(1, 0.01, HD // 2).astype(np.float32),) if op == "rope_kv_write" else ()
    qs, k2, v2 = qkv.copy(), kc.copy(), vc.copy()
    K.reference_op(kind.forms[op])(qs, pos, *rope, trow, slot, pages, k2, v2, *scales, T, R,
                                   MP, PT, H, KVH, HD)
    q32, fk, fv = qkv.copy(), kf.copy(), vf.copy()
    K.reference_op(op)(q32, pos, *rope, trow, slot, pages, fk, fv, T, R, MP, PT, H, KVH, HD)
    np.testing.assert_array_equal(qs, q32)  # the rotated f32 keys stay f32 in qkv
    touched = np.zeros(kc.shape[:2], bool)
    for r, p in zip(trow, pos, strict=True):
        if r >= 0 and slot[r] >= 0:
            touched[pages[slot[r], p // PT], p % PT] = True
    assert touched.sum() == 3  # token 2 is padding, token 3's row has no slot
    np.testing.assert_array_equal((k2 != kc).any(axis=(2, 3)), touched)
    np.testing.assert_array_equal(k2[touched], kind.encode(fk[touched], ks))
    np.testing.assert_array_equal(v2[touched], kind.encode(fv[touched], vs))
    np.testing.assert_array_equal(k2[~touched], kc[~touched])
    np.testing.assert_array_equal(v2[~touched], vc[~touched])


@each_kind
def test_readers_equal_their_f32_op_over_the_decoded_planes(kind):
    """Bit for bit: the forms decode exactly the positions the f32 op gathers."""
    rng = np.random.default_rng(2)
    B = 3
    pages, coded_planes, plain_planes = _setup(kind, rng, B)
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
        plain = make(plain_planes)
        K.reference_op(op)(*plain)
        coded = make(coded_planes)
        K.reference_op(kind.forms[op])(*coded)
        outs = [i for i, p in enumerate(K.kernel_params(op)) if p.direction != "in"]
        assert outs, op
        for i in outs:
            j = i + len(_scales(kind))  # the scales shift every later argument
            np.testing.assert_array_equal(coded[j], plain[i], err_msg=op)
            assert plain[i].dtype != np.float32 or np.abs(plain[i]).sum() > 0, op


@each_kind
def test_row_copy_moves_stored_rows_as_they_are(kind):
    rng = np.random.default_rng(3)
    src = kind.store(rng.standard_normal((5, PT, KVH, HD)))
    dst = np.zeros((3, PT, KVH, HD), kind.held)
    K.reference_op(kind.forms["row_copy"])(src, dst, np.array([4, -1, 1], np.int32),
                                           np.array([0, 2, 2], np.int32), 3, PT * KVH * HD)
    np.testing.assert_array_equal(dst[0], src[4])
    np.testing.assert_array_equal(dst[2], src[1])
    assert not dst[1].any()


@each_kind
def test_a_plane_is_read_only_as_flat_token_rows(kind):
    plane = kind.plane(np.zeros((3, PT, KVH, HD), kind.held), np.ones(KVH, np.float32))
    rows = plane.reshape(-1, KVH, HD)[np.array([0, 5])]
    assert (rows.shape, rows.dtype) == ((2, KVH, HD), np.float32)
    with pytest.raises(ValueError, match=r"read as \(-1, 2, 8\)"):
        plane.reshape(3, -1)


@each_kind
def test_every_form_has_its_op_params_with_stored_planes(kind):
    """A form's parameters are its op's, the planes of the kind's dtype, e4m3's scales
    (f32 inputs) right after ``v_cache``."""
    scale_params = [K.ParamSpec(n, "buffer", "f32", "in") for n in ("k_scale", "v_scale")]
    for op, form in kind.forms.items():
        want = [p._replace(dtype=kind.param_dtype) if p.name in PLANE_PARAMS else p
                for p in K.kernel_params(op)]
        names = [p.name for p in want]
        if kind.scaled and "v_cache" in names:  # row_copy moves rows, scales untouched
            at = names.index("v_cache") + 1
            want[at:at] = scale_params
        assert list(K.kernel_params(form)) == want, form


# Each encoding against ml_dtypes.


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


def test_a_bf16_plane_holds_only_uint16_bit_patterns():
    with pytest.raises(TypeError, match="uint16 bit patterns, not float32"):
        Bf16Plane(np.zeros((3, PT, KVH, HD), np.float32))
