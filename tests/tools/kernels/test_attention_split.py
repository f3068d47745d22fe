"""attention_decode_split + attention_decode_merge equal attention_decode."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import (
    attention_decode,
    attention_decode_merge,
    attention_decode_split,
    check_launch,
)


def _case(rng, B=5, H=6, KVH=2, HD=16, PT=4, MP=16, S=6):
    P = S * MP
    pages = rng.permutation(P).astype(np.int32).reshape(S, MP)
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    slot = np.array([0, 3, -1, 5, 2][:B], np.int32)
    pos = rng.integers(0, PT * MP, B).astype(np.int32)
    pos[0] = 0
    return qkv, pos, slot, pages, kc, vc


@pytest.mark.parametrize("split", [4, 7, 16, 64])
def test_split_merge_equals_decode(split):
    rng = np.random.default_rng(split)
    B, H, KVH, HD, PT, MP = 5, 6, 2, 16, 4, 16
    qkv, pos, slot, pages, kc, vc = _case(rng)
    NS = -(-PT * MP // split)
    scale = HD ** -0.5
    ref = np.full((B, H * HD), np.nan, np.float32)
    attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    ml = np.full((B, H, NS, 2), np.nan, np.float32)
    po = np.full((B, H, NS, HD), np.nan, np.float32)
    args = (qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH, HD, NS, split, scale)
    check_launch("attention_decode_split", args)
    attention_decode_split(*args)
    assert np.isfinite(ml).all() and np.isfinite(po).all()
    out = np.full((B, H * HD), np.nan, np.float32)
    check_launch("attention_decode_merge", (ml, po, slot, out, B, H, HD, NS))
    attention_decode_merge(ml, po, slot, out, B, H, HD, NS)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    assert (out[2] == 0).all()  # padding row


def test_merge_reads_no_output_of_an_empty_split():
    """The GPU's live-split layout leaves an empty split's ``part_o`` unwritten: the merge
    gives the same bits whatever that buffer holds (NaN here)."""
    rng = np.random.default_rng(3)
    B, H, KVH, HD, PT, MP, split = 5, 6, 2, 16, 4, 16, 8
    qkv, pos, slot, pages, kc, vc = _case(rng)
    pos[1] = 9  # 2 live splits of 8
    NS = PT * MP // split
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    attention_decode_split(qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH, HD, NS,
                           split, HD ** -0.5)
    want = np.zeros((B, H * HD), np.float32)
    attention_decode_merge(ml, po, slot, want, B, H, HD, NS)
    empty = ml[..., 1] == 0
    assert empty[1, :, 2:].all() and not empty[1, :, :2].any()
    po[empty] = np.nan
    got = np.zeros_like(want)
    attention_decode_merge(ml, po, slot, got, B, H, HD, NS)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_split_rejects_positions_past_the_splits():
    rng = np.random.default_rng(0)
    B, H, KVH, HD, PT, MP = 5, 6, 2, 16, 4, 16
    qkv, pos, slot, pages, kc, vc = _case(rng)
    pos[1] = 40
    ml = np.zeros((B, H, 2, 2), np.float32)
    po = np.zeros((B, H, 2, HD), np.float32)
    with pytest.raises(IndexError, match="splits"):
        attention_decode_split(qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH, HD,
                               2, 16, 0.25)


def test_split_ignores_bytes_past_the_context():
    """NaN in cache positions past a row's context (same page or later pages) and garbage
    page-table columns past its last page change nothing."""
    rng = np.random.default_rng(11)
    B, H, KVH, HD, PT, MP, split = 5, 6, 2, 16, 4, 16, 8
    qkv, pos, slot, pages, kc, vc = _case(rng)
    NS = -(-PT * MP // split)
    scale = HD ** -0.5
    ref = np.zeros((B, H * HD), np.float32)
    attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    kp, vp, tp = kc.copy(), vc.copy(), pages.copy()
    for b in range(B):
        if slot[b] < 0:
            continue
        ctx = int(pos[b]) + 1
        last = (ctx - 1) // PT
        kp[tp[slot[b], last], (ctx - 1) % PT + 1:] = np.nan
        vp[tp[slot[b], last], (ctx - 1) % PT + 1:] = np.nan
        tp[slot[b], last + 1:] = 10_000  # no such page
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    attention_decode_split(qkv, pos, slot, tp, kp, vp, ml, po, B, MP, PT, H, KVH, HD, NS,
                           split, scale)
    out = np.zeros((B, H * HD), np.float32)
    attention_decode_merge(ml, po, slot, out, B, H, HD, NS)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)


def test_fused_equals_split_then_merge_and_checks_its_counters():
    """attention_decode_fused is split then merge bit for bit; its split counters must be
    zero before a launch (they are after one on the GPU)."""
    from helios_tools.kernels import attention_decode_fused

    rng = np.random.default_rng(7)
    B, H, KVH, HD, PT, MP, split = 5, 6, 2, 16, 4, 16, 16
    qkv, pos, slot, pages, kc, vc = _case(rng)
    NS = PT * MP // split
    scale = HD ** -0.5
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    attention_decode_split(qkv, pos, slot, pages, kc, vc, ml, po, B, MP, PT, H, KVH, HD, NS,
                           split, scale)
    ref = np.zeros((B, H * HD), np.float32)
    attention_decode_merge(ml, po, slot, ref, B, H, HD, NS)
    arrivals = np.zeros((B, KVH), np.int32)
    out = np.full((B, H * HD), np.nan, np.float32)
    args = (qkv, pos, slot, pages, kc, vc, np.full_like(ml, np.nan), np.full_like(po, np.nan),
            arrivals, out, B, MP, PT, H, KVH, HD, NS, split, scale)
    check_launch("attention_decode_fused", args)
    attention_decode_fused(*args)
    assert np.array_equal(out, ref) and (arrivals == 0).all()
    arrivals[3, 1] = 2
    with pytest.raises(ValueError, match="arrivals must be zero before a launch"):
        attention_decode_fused(*args)
