"""Paged KV writes and causal paged attention against a dense per-token reference.

Geometry is tiny: 3-4 physical rows, pages of 4 tokens with shuffled (non-contiguous) page
ids. Every cache page a request does not own is poisoned with NaN, and unused page-table
entries point at poisoned pages or out of range, so any stray read or write shows up.
"""

import math

import numpy as np
import pytest
from helios_tools.kernels import attention_decode, attention_prefill, kv_write

PT, MP, P, HD = 4, 4, 20, 8


def _dense_reference(q, k, v, n_ctx, scale):
    """q: [H, HD] one token; k, v: [L, KVH, HD] the request's full history; n_ctx visible."""
    H, KVH = q.shape[0], k.shape[1]
    out = np.zeros((H, HD))
    for h in range(H):
        kh = h // (H // KVH)
        s = [scale * float(np.dot(q[h].astype(np.float64), k[j, kh])) for j in range(n_ctx)]
        m = max(s)
        w = [math.exp(x - m) for x in s]
        z = sum(w)
        for j in range(n_ctx):
            out[h] += w[j] / z * v[j, kh]
    return out.reshape(-1)


class Layout:
    """Random requests on shuffled pages of a NaN-poisoned cache."""

    def __init__(self, H, KVH, lengths, seed=0):
        rng = np.random.default_rng(seed)
        self.H, self.KVH = H, KVH
        self.width = (H + 2 * KVH) * HD
        self.k_cache = np.full((P, PT, KVH, HD), np.nan, np.float32)
        self.v_cache = np.full((P, PT, KVH, HD), np.nan, np.float32)
        S = len(lengths) + 1
        # unused entries: a poisoned page id or garbage
        self.page_table = np.full((S, MP), -7, np.int32)
        self.page_table[:, 1::2] = P - 1
        pages = rng.permutation(P - 1)  # page P-1 is never owned: always NaN
        self.slots = rng.permutation(S)[: len(lengths)].astype(np.int32)
        self.qkv = {}
        used = 0
        for slot, n in zip(self.slots, lengths, strict=True):
            npages = -(-n // PT)
            self.page_table[slot, :npages] = pages[used : used + npages]
            used += npages
            self.qkv[int(slot)] = rng.standard_normal((n, self.width)).astype(np.float32)

    def heads(self, slot):
        x = self.qkv[slot]
        H, KVH = self.H, self.KVH
        q = x[:, : H * HD].reshape(-1, H, HD)
        k = x[:, H * HD : (H + KVH) * HD].reshape(-1, KVH, HD)
        v = x[:, (H + KVH) * HD :].reshape(-1, KVH, HD)
        return q, k, v

    def pack(self, pieces, pad_tokens=0, pad_row=False):
        """pieces: [(submission row index into slots, start, stop)] -> packed prefill inputs."""
        qkv, pos, rows = [], [], []
        slot = list(self.slots)
        for r, a, b in pieces:
            qkv.append(self.qkv[int(self.slots[r])][a:b])
            pos.extend(range(a, b))
            rows.extend([r] * (b - a))
        if pad_row:  # a padding submission row whose tokens must be ignored too
            slot.append(-1)
            qkv.append(np.full((2, self.width), 1e30, np.float32))
            pos.extend([0, 1])
            rows.extend([len(slot) - 1] * 2)
        qkv.append(np.full((pad_tokens, self.width), np.nan, np.float32))
        pos.extend([999] * pad_tokens)
        rows.extend([-1] * pad_tokens)
        return (
            np.concatenate(qkv),
            np.array(pos, np.int32),
            np.array(rows, np.int32),
            np.array(slot, np.int32),
        )

    def prefill(self, pieces, pad_tokens=0, pad_row=False):
        qkv, pos, rows, slot = self.pack(pieces, pad_tokens, pad_row)
        T, R = len(pos), len(slot)
        geo = (MP, PT, self.H, self.KVH, HD)
        kv_write(qkv, pos, rows, slot, self.page_table, self.k_cache, self.v_cache, T, R, *geo)
        out = np.full((T, self.H * HD), np.nan, np.float32)
        attention_prefill(
            qkv, pos, rows, slot, self.page_table, self.k_cache, self.v_cache, out, T, R, *geo,
            HD**-0.5,
        )  # fmt: skip
        return out, pos, rows


def test_kv_write_places_each_token_and_ignores_padding():
    lay = Layout(4, 2, [6, 3])
    qkv, pos, rows, slot = lay.pack([(0, 0, 6), (1, 0, 3)], pad_tokens=2, pad_row=True)
    poisoned_k = lay.k_cache.copy()
    kv_write(qkv, pos, rows, slot, lay.page_table, lay.k_cache, lay.v_cache, len(pos), len(slot),
             MP, PT, 4, 2, HD)  # fmt: skip
    written = np.zeros((P, PT), bool)
    for t in range(len(pos)):
        r = rows[t]
        if r < 0 or slot[r] < 0:
            continue
        page = lay.page_table[slot[r], pos[t] // PT]
        written[page, pos[t] % PT] = True
        assert np.array_equal(lay.k_cache[page, pos[t] % PT].reshape(-1), qkv[t, 32:48])
        assert np.array_equal(lay.v_cache[page, pos[t] % PT].reshape(-1), qkv[t, 48:64])
    assert written.sum() == 9
    assert np.isnan(lay.k_cache[~written]).all() and np.isnan(lay.v_cache[~written]).all()
    assert np.isnan(poisoned_k[~written]).all()


@pytest.mark.parametrize(("H", "KVH"), [(4, 2), (6, 1), (2, 2)])
def test_prefill_matches_dense_causal_reference(H, KVH):
    lay = Layout(H, KVH, [7, 5, 1], seed=H * 10 + KVH)
    out, pos, rows = lay.prefill([(0, 0, 7), (1, 0, 5), (2, 0, 1)], pad_tokens=3, pad_row=True)
    for t in range(len(pos)):
        r = rows[t]
        if r < 0 or r >= 3:
            assert out[t].tolist() == [0.0] * (H * HD)  # padding token or padding row
            continue
        q, k, v = lay.heads(int(lay.slots[r]))
        ref = _dense_reference(q[pos[t]], k, v, pos[t] + 1, HD**-0.5)
        np.testing.assert_allclose(out[t], ref, rtol=1e-5, atol=1e-5)


def test_chunked_prefill_equals_one_shot():
    one = Layout(4, 2, [10, 6], seed=3)
    full, _, _ = one.prefill([(0, 0, 10), (1, 0, 6)])
    two = Layout(4, 2, [10, 6], seed=3)
    first, _, _ = two.prefill([(1, 0, 2), (0, 0, 3)], pad_tokens=1)
    second, _, rows = two.prefill([(0, 3, 10), (1, 2, 6)])
    np.testing.assert_allclose(first[:2], full[10:12], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(first[2:5], full[0:3], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second[:7], full[3:10], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second[7:], full[12:16], rtol=1e-6, atol=1e-6)
    assert np.array_equal(one.k_cache, two.k_cache, equal_nan=True)
    assert np.array_equal(one.v_cache, two.v_cache, equal_nan=True)


def test_decode_equals_prefill_last_token_and_skips_padding_rows():
    lengths = [9, 2, 13]
    ref = Layout(4, 2, lengths, seed=5)
    full, _, _ = ref.prefill([(r, 0, n) for r, n in enumerate(lengths)])
    lay = Layout(4, 2, lengths, seed=5)
    lay.prefill([(r, 0, n - 1) for r, n in enumerate(lengths)])
    # decode batch: rows 0..2 plus one padding row between them
    order = [2, -1, 0, 1]
    qkv = np.stack(
        [lay.qkv[int(lay.slots[r])][-1] if r >= 0 else np.full(lay.width, np.nan) for r in order]
    ).astype(np.float32)
    pos = np.array([lengths[r] - 1 if r >= 0 else 5 for r in order], np.int32)
    slot = np.array([lay.slots[r] if r >= 0 else -1 for r in order], np.int32)
    B = len(order)
    kv_write(qkv, pos, np.arange(B, dtype=np.int32), slot, lay.page_table, lay.k_cache,
             lay.v_cache, B, B, MP, PT, 4, 2, HD)  # fmt: skip
    assert np.array_equal(lay.k_cache, ref.k_cache, equal_nan=True)
    out = np.full((B, 4 * HD), np.nan, np.float32)
    attention_decode(qkv, pos, slot, lay.page_table, lay.k_cache, lay.v_cache, out, B, MP, PT,
                     4, 2, HD, HD**-0.5)  # fmt: skip
    ends = np.cumsum(lengths) - 1
    for b, r in enumerate(order):
        if r < 0:
            assert out[b].tolist() == [0.0] * (4 * HD)
        else:
            np.testing.assert_allclose(out[b], full[ends[r]], rtol=1e-6, atol=1e-6)


def test_attention_rejects_positions_beyond_the_page_table():
    lay = Layout(2, 1, [3])
    qkv = lay.qkv[int(lay.slots[0])][:1]
    out = np.zeros((1, 2 * HD), np.float32)
    with pytest.raises(IndexError):
        attention_decode(qkv, np.array([MP * PT], np.int32), lay.slots[:1], lay.page_table,
                         lay.k_cache, lay.v_cache, out, 1, MP, PT, 2, 1, HD, 1.0)  # fmt: skip


def test_kv_write_rejects_positions_outside_the_page_table():
    lay = Layout(2, 1, [3])
    qkv = lay.qkv[int(lay.slots[0])][:1]
    for bad in (-1, MP * PT):
        with pytest.raises(IndexError):
            kv_write(qkv, np.array([bad], np.int32), np.zeros(1, np.int32), lay.slots[:1],
                     lay.page_table, lay.k_cache, lay.v_cache, 1, 1, MP, PT, 2, 1, HD)  # fmt: skip
