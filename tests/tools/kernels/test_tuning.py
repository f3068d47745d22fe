"""The decode-split tuning ops: tuned split + merge equal attention_decode for every split
count (each count its own rounding, all within f32 of the dense reference), the split
count decides which splits run, and the producer's setup/mark/select do what they say."""

from __future__ import annotations

import numpy as np
import pytest
from helios_tools.kernels import (
    attention_decode,
    attention_decode_merge_tuned,
    attention_decode_split,
    attention_decode_split_tuned,
    check_launch,
    split_tuning_select,
    split_tuning_setup,
    timer_mark,
    tuned_split_length,
)

B, H, KVH, HD, PT, MP, S = 5, 6, 2, 16, 4, 16, 6
NS, SPLIT = 8, 8  # 64 positions in 8 captured splits


def _case(seed=0):
    rng = np.random.default_rng(seed)
    P = S * MP
    pages = rng.permutation(P).astype(np.int32).reshape(S, MP)
    kc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    vc = rng.standard_normal((P, PT, KVH, HD)).astype(np.float32)
    qkv = rng.standard_normal((B, (H + 2 * KVH) * HD)).astype(np.float32)
    slot = np.array([0, 3, -1, 5, 2], np.int32)
    pos = np.array([0, 63, 10, 37, 20], np.int32)
    return qkv, pos, slot, pages, kc, vc


@pytest.mark.parametrize("ns", [8, 4, 2, 1, 3])
def test_tuned_split_and_merge_equal_dense_attention_for_every_count(ns):
    qkv, pos, slot, pages, kc, vc = _case(ns)
    scale = HD ** -0.5
    ref = np.zeros((B, H * HD), np.float32)
    attention_decode(qkv, pos, slot, pages, kc, vc, ref, B, MP, PT, H, KVH, HD, scale)
    ml = np.full((B, H, NS, 2), np.nan, np.float32)
    po = np.full((B, H, NS, HD), np.nan, np.float32)
    choice = np.array([ns], np.int32)
    args = (qkv, pos, slot, pages, kc, vc, ml, po, choice, B, MP, PT, H, KVH, HD, NS, SPLIT,
            scale)
    check_launch("attention_decode_split_tuned", args)
    attention_decode_split_tuned(*args)
    # The count decides which splits run: the first ns are written, the rest untouched.
    assert np.isfinite(ml[:, :, :ns]).all() and np.isnan(ml[:, :, ns:]).all()
    assert np.isnan(po[:, :, ns:]).all()
    out = np.full((B, H * HD), np.nan, np.float32)
    merge_args = (ml, po, slot, choice, out, B, H, HD, NS)
    check_launch("attention_decode_merge_tuned", merge_args)
    attention_decode_merge_tuned(*merge_args)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    assert (out[2] == 0).all()  # padding row


def test_the_captured_count_is_the_untuned_split_exactly():
    qkv, pos, slot, pages, kc, vc = _case(1)
    plain = [np.zeros((B, H, NS, 2), np.float32), np.zeros((B, H, NS, HD), np.float32)]
    tuned = [np.zeros_like(plain[0]), np.zeros_like(plain[1])]
    attention_decode_split(qkv, pos, slot, pages, kc, vc, *plain, B, MP, PT, H, KVH, HD, NS,
                           SPLIT, 0.25)
    attention_decode_split_tuned(qkv, pos, slot, pages, kc, vc, *tuned, np.array([NS], np.int32),
                                 B, MP, PT, H, KVH, HD, NS, SPLIT, 0.25)
    assert all(np.array_equal(a, b) for a, b in zip(plain, tuned, strict=True))
    assert [tuned_split_length(8, 8, n) for n in (8, 4, 3, 1)] == [8, 16, 22, 64]


@pytest.mark.parametrize("ns", [0, 9, -1])
def test_a_count_outside_the_captured_splits_is_refused(ns):
    qkv, pos, slot, pages, kc, vc = _case()
    ml = np.zeros((B, H, NS, 2), np.float32)
    po = np.zeros((B, H, NS, HD), np.float32)
    with pytest.raises(ValueError, match=rf"tuned split count {ns} outside \[1, 8\]"):
        attention_decode_split_tuned(qkv, pos, slot, pages, kc, vc, ml, po,
                                     np.array([ns], np.int32), B, MP, PT, H, KVH, HD, NS,
                                     SPLIT, 0.25)
    with pytest.raises(ValueError, match="tuned split count"):
        attention_decode_merge_tuned(ml, po, slot, np.array([ns], np.int32),
                                     np.zeros((B, H * HD), np.float32), B, H, HD, NS)


def test_setup_writes_the_timing_workload():
    rows, mp = 3, 5
    positions, slot = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
    pages = np.zeros((rows, mp), np.int32)
    candidates = np.full((4, 4), -1, np.int32)
    split_tuning_setup(positions, slot, pages, candidates, rows, mp, PT, 3, 8, 4, 2, 0)
    assert positions.tolist() == [mp * PT - 1] * rows and slot.tolist() == [0, 1, 2]
    assert pages.tolist() == [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [2, 3, 4, 0, 1]]
    assert candidates[:, 0].tolist() == [8, 4, 2, -1]


def test_select_writes_the_fastest_candidate_and_marks_are_nanoseconds():
    candidates = np.zeros((4, 4), np.int32)
    candidates[:3, 0] = [8, 4, 2]

    def stamps_of(*pairs):
        out = np.zeros((2 * len(pairs), 2), np.uint32)
        for i, (start, end) in enumerate(pairs):
            for j, ns in enumerate((start, end)):
                out[2 * i + j] = (ns & 0xFFFFFFFF, ns >> 32)
        return out

    choice = np.zeros(1, np.int32)
    base = 5 << 32  # the high words differ from the low ones
    split_tuning_select(stamps_of((base, base + 900), (base + 1000, base + 1300),
                                  (base + 2000, base + 2500)), candidates, choice, 3)
    assert choice.tolist() == [4]
    split_tuning_select(stamps_of((0, 300), (0, 300), (0, 300)), candidates, choice, 3)
    assert choice.tolist() == [8]  # the first of equal times
    stamps = np.zeros((2, 2), np.uint32)
    timer_mark(stamps, 0)
    timer_mark(stamps, 1)
    first, second = (int(lo) | int(hi) << 32 for lo, hi in stamps)
    assert 0 < first <= second
