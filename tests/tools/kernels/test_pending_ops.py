"""slot_gather / slot_scatter: the device-owned pending token's read and write."""

from __future__ import annotations

import numpy as np
from helios_tools.kernels import slot_gather, slot_scatter


def test_slot_gather_reads_each_rows_slot_and_pads_with_minus_one():
    src = np.array([10, 11, 12, 13], np.int32)
    slot = np.array([2, -1, 0, 4, 3], np.int32)
    out = np.full(6, -7777, np.int32)
    slot_gather(src, slot, out, 5, 4)
    assert out.tolist() == [12, -1, 10, -1, 13, -7777]  # row 5 is past R: untouched


def test_slot_scatter_writes_sampling_rows_with_valid_slots_only():
    dst = np.array([0, 1, 2, 3], np.int32)
    values = np.array([40, 41, 42, 43, 44], np.int32)
    slot = np.array([3, 1, -1, 0, 2], np.int32)
    decision = np.array([1, 0, 1, 1, 1], np.int32)
    slot_scatter(values, slot, decision, dst, 4, 4)  # row 4 is past R
    assert dst.tolist() == [43, 1, 2, 40]


def test_gather_after_scatter_round_trips():
    dst = np.zeros(8, np.int32)
    slot = np.array([5, 2, 7], np.int32)
    slot_scatter(np.array([9, 8, 7], np.int32), slot, np.ones(3, np.int32), dst, 3, 8)
    out = np.zeros(3, np.int32)
    slot_gather(dst, slot[::-1].copy(), out, 3, 8)
    assert out.tolist() == [7, 8, 9]


def test_fused_ops_equal_their_parts():
    from helios_tools.kernels import kv_write, linear, rope, rope_kv_write, silu_mul, swiglu_linear

    rng = np.random.default_rng(7)
    T, R, H, KVH, HD, PT, MP = 5, 2, 4, 2, 8, 4, 3
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    pos = np.array([0, 1, 2, 5, 11], np.int32)
    inv = (1.0 / 10000 ** (np.arange(0, HD, 2) / HD)).astype(np.float32)
    trow = np.array([0, 0, 1, 1, -1], np.int32)
    slot = np.array([1, 0], np.int32)
    pages = np.array([[3, 4, 5], [0, 1, 2]], np.int32)
    kc = rng.standard_normal((6, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((6, PT, KVH, HD)).astype(np.float32)
    a = [qkv.copy(), kc.copy(), vc.copy()]
    rope(a[0], pos, inv, T, H, KVH, HD)
    kv_write(a[0], pos, trow, slot, pages, a[1], a[2], T, R, MP, PT, H, KVH, HD)
    b = [qkv.copy(), kc.copy(), vc.copy()]
    rope_kv_write(b[0], pos, inv, trow, slot, pages, b[1], b[2], T, R, MP, PT, H, KVH, HD)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    assert not np.array_equal(b[1], kc)  # the cache was written
    gu = rng.standard_normal((3, 10)).astype(np.float32)
    w = rng.standard_normal((7, 5)).astype(np.float32)
    act = np.zeros((3, 5), np.float32)
    silu_mul(gu, act, 3, 5)
    want = np.zeros((3, 7), np.float32)
    linear(act, w, want, 3, 7, 5)
    got = np.full((3, 7), np.nan, np.float32)
    swiglu_linear(gu, w, got, 3, 7, 5)
    assert np.array_equal(got, want)


def test_folded_ops_equal_the_unfolded_sequence():
    """Layer folding's ops are bit for bit the sequence they replace in a layer:
    linear + add_rmsnorm (residual add, then the next norm) and rmsnorm + linear."""
    from helios_tools.kernels import (
        add_rmsnorm,
        linear,
        linear_add,
        rmsnorm,
        rmsnorm_linear,
        swiglu_linear,
        swiglu_linear_add,
    )

    rng = np.random.default_rng(11)
    T, D, N, F = 3, 12, 9, 6
    res = (rng.standard_normal((T, D)) * 2).astype(np.float32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    wo = rng.standard_normal((D, D)).astype(np.float32)
    g = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    wq = rng.standard_normal((N, D)).astype(np.float32)
    # unfolded: o = x wo^T; res += o; h = rmsnorm(res); q = h wq^T
    o, h, q = (np.zeros((T, n), np.float32) for n in (D, D, N))
    r1 = res.copy()
    linear(x, wo, o, T, D, D)
    add_rmsnorm(o, r1, g, h, T, D, 1e-5)
    linear(h, wq, q, T, N, D)
    # folded: res += x wo^T (epilogue); q = rmsnorm(res) wq^T (prologue)
    r2 = res.copy()
    linear_add(x, wo, r2, T, D, D)
    q2 = np.full((T, N), np.nan, np.float32)
    rmsnorm_linear(r2, g, wq, q2, T, N, D, 1e-5)
    assert np.array_equal(r1, r2) and np.array_equal(q, q2)
    h2 = np.zeros((T, D), np.float32)
    rmsnorm(r2, g, h2, T, D, 1e-5)
    assert np.array_equal(h, h2)
    gu = rng.standard_normal((T, 2 * F)).astype(np.float32)
    wd = rng.standard_normal((D, F)).astype(np.float32)
    y = np.zeros((T, D), np.float32)
    swiglu_linear(gu, wd, y, T, D, F)
    r3 = res.copy()
    swiglu_linear_add(gu, wd, r3, T, D, F)
    assert np.array_equal(r3, res + y)
