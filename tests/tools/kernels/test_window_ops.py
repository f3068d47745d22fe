"""The ops a sliding-window family adds: windowed prefill and decode attention against a
dense reference over the last W positions (the pages wholly behind every query's window
poisoned with NaN and their page-table entries pointed elsewhere, so any read of them
shows), per-head RMS norm, GeGLU and the in-place scale."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helios_tools.kernels import reference_op

from tests.tools.kernels.test_attention import HD, MP, PT, Layout, _dense_reference

prefill_window = reference_op("attention_prefill_window")
decode_window = reference_op("attention_decode_window")


def _windowed_reference(q, k, v, pos, W, scale):
    """Dense attention of the query at `pos` over positions max(0, pos-W+1)..pos."""
    lo = max(0, pos - W + 1)
    return _dense_reference(q, k[lo:], v[lo:], pos + 1 - lo, scale)


def _forget_behind(lay: Layout, slot: int, first_seen: int) -> None:
    """Poison the pages of `slot` wholly before position `first_seen` and point their
    page-table entries at a poisoned page (what a page returned to the pool may hold)."""
    for j in range(first_seen // PT):
        lay.k_cache[lay.page_table[slot, j]] = np.nan
        lay.v_cache[lay.page_table[slot, j]] = np.nan
        lay.page_table[slot, j] = lay.k_cache.shape[0] - 1


@pytest.mark.parametrize("W", [1, 3, 5, 64])
def test_windowed_prefill_matches_the_dense_window(W):
    lengths = [13, 6]
    lay = Layout(4, 2, lengths, seed=W)
    lay.prefill([(0, 0, 9), (1, 0, 2)])  # earlier chunks in the cache
    for r, start in ((0, 9), (1, 2)):  # later chunk: pages behind its first window go
        _forget_behind(lay, int(lay.slots[r]), max(0, start - W + 1))
    qkv, pos, rows, slot = lay.pack([(1, 2, 6), (0, 9, 13)], pad_tokens=2)
    T, R = len(pos), len(slot)
    reference_op("kv_write")(qkv, pos, rows, slot, lay.page_table, lay.k_cache, lay.v_cache,
                             T, R, MP, PT, 4, 2, HD)
    out = np.full((T, 4 * HD), np.nan, np.float32)
    prefill_window(qkv, pos, rows, slot, lay.page_table, lay.k_cache, lay.v_cache, out, T, R,
                   MP, PT, 4, 2, HD, W, HD**-0.5)
    for t in range(T):
        if rows[t] < 0:
            assert out[t].tolist() == [0.0] * (4 * HD)
            continue
        q, k, v = lay.heads(int(lay.slots[rows[t]]))
        ref = _windowed_reference(q[pos[t]], k, v, int(pos[t]), W, HD**-0.5)
        np.testing.assert_allclose(out[t], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("W", [1, 4, 6, 64])
def test_windowed_decode_matches_the_dense_window(W):
    lengths = [14, 3, 9]
    lay = Layout(4, 2, lengths, seed=10 + W)
    lay.prefill([(r, 0, n) for r, n in enumerate(lengths)])
    order = [2, -1, 0, 1]
    for r in order:
        if r >= 0:
            _forget_behind(lay, int(lay.slots[r]), max(0, lengths[r] - W))
    qkv = np.stack([lay.qkv[int(lay.slots[r])][-1] if r >= 0 else np.full(lay.width, np.nan)
                    for r in order]).astype(np.float32)
    pos = np.array([lengths[r] - 1 if r >= 0 else 5 for r in order], np.int32)
    slot = np.array([lay.slots[r] if r >= 0 else -1 for r in order], np.int32)
    B = len(order)
    out = np.full((B, 4 * HD), np.nan, np.float32)
    decode_window(qkv, pos, slot, lay.page_table, lay.k_cache, lay.v_cache, out, B, MP, PT, 4,
                  2, HD, W, HD**-0.5)
    for b, r in enumerate(order):
        if r < 0:
            assert out[b].tolist() == [0.0] * (4 * HD)
            continue
        q, k, v = lay.heads(int(lay.slots[r]))
        ref = _windowed_reference(q[pos[b]], k, v, int(pos[b]), W, HD**-0.5)
        np.testing.assert_allclose(out[b], ref, rtol=1e-5, atol=1e-5)


def test_a_window_past_the_context_is_causal_attention():
    lay = Layout(6, 1, [11, 4], seed=2)
    whole, _, _ = lay.prefill([(0, 0, 11), (1, 0, 4)])
    qkv, pos, rows, slot = lay.pack([(0, 0, 11), (1, 0, 4)])
    out = np.full_like(whole, np.nan)
    prefill_window(qkv, pos, rows, slot, lay.page_table, lay.k_cache, lay.v_cache, out,
                   len(pos), len(slot), MP, PT, 6, 1, HD, MP * PT, HD**-0.5)
    np.testing.assert_array_equal(out, whole)


def test_head_rmsnorm_normalizes_query_and_key_heads_only():
    rng = np.random.default_rng(0)
    H, KVH, T, eps = 3, 1, 2, 1e-6
    qkv = rng.standard_normal((T, (H + 2 * KVH) * HD)).astype(np.float32)
    qw, kw = (rng.standard_normal(HD).astype(np.float32) for _ in range(2))
    before = qkv.copy()
    reference_op("head_rmsnorm")(qkv, qw, kw, T, H, KVH, HD, eps)
    for t in range(T):
        for h in range(H + KVH):
            x = before[t, h * HD:(h + 1) * HD].astype(np.float64)
            want = x / math.sqrt((x * x).mean() + eps) * (qw if h < H else kw)
            np.testing.assert_allclose(qkv[t, h * HD:(h + 1) * HD], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(qkv[:, (H + KVH) * HD:], before[:, (H + KVH) * HD:])


def test_gelu_mul_is_the_tanh_geglu_and_scale_multiplies():
    gate_up = np.array([[-3.0, -0.5, 0.0, 2.0, 1.5, 2.0, -1.0, 0.5]], np.float32)
    out = np.full((1, 4), np.nan, np.float32)
    reference_op("gelu_mul")(gate_up, out, 1, 4)
    g = gate_up[0, :4].astype(np.float64)
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
    np.testing.assert_allclose(out[0], gelu * gate_up[0, 4:], rtol=1e-6, atol=1e-7)
    x = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    reference_op("scale")(x, 1, 2, 0.5)
    assert x.tolist() == [[0.5, -1.0, 3.0], [4.0, 5.0, 6.0]]
